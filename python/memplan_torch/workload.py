"""Workload files (memplan.workload/v1), YAML or JSON; see docs/measure-format.md.

The same file is read by `memplan plan --workload`. Unknown fields and wrong types are refused with the
field named.
"""

import json
import os

from . import compat, harness

SCHEMA = "memplan.workload/v1"

# field -> (types, default); None default with required=True means required
_TOP = {
    "schema": ((str,), SCHEMA),
    "name": ((str,), None),
    "model": ((str,), None),
    "model_args": ((dict,), None),
    "dtype": ((str,), "float32"),
    "batch": ((int,), None),
    "seq_len": ((int,), None),
    "batch_dim": ((int,), 0),
    "device": ((str,), "auto"),
    "warmup": ((int,), 1),
    "iters": ((int,), 3),
    "seed": ((int,), 0),
    "optimizer": ((str,), "adamw"),
    "foreach": ((bool,), None),
    "hold_outputs": ((str,), "none"),
    "strategy": ((dict,), None),
}
_REQUIRED = ("model", "batch")
_STRATEGY = {
    "accumulation": ((int,), 1),
    "checkpoint": ((str,), "none"),
    "checkpoint_blocks": ((str,), None),
    "offload": ((str,), "none"),
}
DEVICES = ("auto", "cpu", "cuda")
CHECKPOINTS = ("none", "blocks")
OFFLOADS = ("none", "activations")
# how long the loop keeps the model's output in a variable (memplan's loop.hold-outputs): dropped once the loss
# exists; until backward is done; until the next forward returns and rebinds it (through the optimizer step)
HOLDS = ("none", "backward", "next-forward")


class WorkloadError(ValueError):
    pass


def _typename(types):
    return " or ".join({int: "integer", str: "string", dict: "mapping", bool: "boolean"}[t] for t in types)


def _check(where, obj, spec):
    if not isinstance(obj, dict):
        raise WorkloadError("%s: must be a mapping, got %s" % (where, type(obj).__name__))
    out = {}
    for k, v in obj.items():
        if k not in spec:
            raise WorkloadError("%s: unknown field %r (known fields: %s)" % (where, k, ", ".join(sorted(spec))))
        types, _ = spec[k]
        if v is None:
            out[k] = None
            continue
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        if not ok:
            raise WorkloadError("%s: field %r must be a %s, got %r" % (where, k, _typename(types), v))
        out[k] = v
    for k, (_, d) in spec.items():
        if out.get(k) is None:
            out[k] = d
    return out


def validate(obj, where="workload"):
    """Validates a workload mapping and returns it normalised with defaults filled."""
    w = _check(where, obj, _TOP)
    for k in _REQUIRED:
        if w.get(k) is None:
            raise WorkloadError("%s: missing required field %r" % (where, k))
    if w["schema"] != SCHEMA:
        raise WorkloadError("%s: field 'schema' must be %r, got %r" % (where, SCHEMA, w["schema"]))
    if ":" not in w["model"]:
        raise WorkloadError("%s: field 'model' must be MODULE:FUNCTION, got %r" % (where, w["model"]))
    if w["batch"] < 1:
        raise WorkloadError("%s: field 'batch' must be >= 1, got %d" % (where, w["batch"]))
    if w["seq_len"] is not None and w["seq_len"] < 1:
        raise WorkloadError("%s: field 'seq_len' must be >= 1, got %d" % (where, w["seq_len"]))
    for k in ("warmup", "seed", "batch_dim"):
        if w[k] < 0:
            raise WorkloadError("%s: field %r must be >= 0, got %d" % (where, k, w[k]))
    if w["iters"] < 1:
        raise WorkloadError("%s: field 'iters' must be >= 1, got %d" % (where, w["iters"]))
    try:
        compat.parse_dtype(w["dtype"])
    except ValueError as e:
        raise WorkloadError("%s: field 'dtype': %s" % (where, e))
    if w["device"] not in DEVICES:
        raise WorkloadError("%s: field 'device' must be one of %s, got %r" % (where, ", ".join(DEVICES), w["device"]))
    if w["optimizer"] not in harness.OPTIMIZERS:
        raise WorkloadError("%s: field 'optimizer': unknown optimizer %r (choose one of: %s)"
                            % (where, w["optimizer"], ", ".join(harness.OPTIMIZERS)))
    if w["hold_outputs"] not in HOLDS:
        raise WorkloadError("%s: field 'hold_outputs' must be one of %s, got %r"
                            % (where, ", ".join(HOLDS), w["hold_outputs"]))
    if w["model_args"] is None:
        w["model_args"] = {}
    s = _check(where + ": strategy", w["strategy"] or {}, _STRATEGY)
    if s["accumulation"] < 1:
        raise WorkloadError("%s: field 'strategy.accumulation' must be >= 1, got %d" % (where, s["accumulation"]))
    if w["batch"] % s["accumulation"]:
        raise WorkloadError("%s: field 'batch' (%d) must be divisible by 'strategy.accumulation' (%d)"
                            % (where, w["batch"], s["accumulation"]))
    if s["checkpoint"] not in CHECKPOINTS:
        raise WorkloadError("%s: field 'strategy.checkpoint' must be one of %s, got %r"
                            % (where, ", ".join(CHECKPOINTS), s["checkpoint"]))
    if s["offload"] not in OFFLOADS:
        raise WorkloadError("%s: field 'strategy.offload' must be one of %s, got %r"
                            % (where, ", ".join(OFFLOADS), s["offload"]))
    w["strategy"] = s
    if w["name"] is None:
        w["name"] = w["model"].split(":")[-1]
    return w


def load(path):
    """Reads a YAML (needs PyYAML) or JSON workload file and validates it."""
    with open(path) as f:
        text = f.read()
    where = os.path.basename(path)
    if path.endswith(".json"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise WorkloadError("%s: invalid JSON: %s" % (where, e))
    else:
        try:
            import yaml
        except ImportError:
            try:
                obj = json.loads(text)
            except ValueError:
                raise WorkloadError("%s: PyYAML is not installed (apt-get install python3-yaml); "
                                    "write the workload as JSON instead" % where)
        else:
            try:
                obj = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise WorkloadError("%s: invalid YAML: %s" % (where, e))
    return validate(obj, where)
