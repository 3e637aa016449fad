"""Workload files (memplan.workload/v1), YAML or JSON; see docs/measure-format.md.

The same file is read by `memplan plan --workload`. Unknown fields and wrong types are refused with the
field named.
"""

import json
import math
import os
import re
import stat

from . import compat

def _table_path():
    """fields.json: beside this module when installed with it, else the repository's workload/fields.json."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "fields.json"), os.path.join(here, "..", "..", "workload", "fields.json")):
        if os.path.exists(p):
            return p
    raise ImportError("memplan_torch.workload: workload/fields.json (the field table) not found beside %s" % here)


# The field table memplan's Go reader embeds (workload/fields.json): one table, so the readers cannot drift apart.
with open(_table_path()) as _f:
    TABLE = json.load(_f)
SCHEMA = TABLE["schema"]
_TYPES = {"integer": int, "string": str, "mapping": dict, "boolean": bool}
# field -> (types, default), in the table's order
_TOP = {f["name"]: ((_TYPES[f["type"]],), f.get("default")) for f in TABLE["top"]}
_STRATEGY = {f["name"]: ((_TYPES[f["type"]],), f.get("default")) for f in TABLE["strategy"]}
_SPECS = {"": {f["name"]: f for f in TABLE["top"]}, "strategy.": {f["name"]: f for f in TABLE["strategy"]}}
_REQUIRED = tuple(f["name"] for f in TABLE["top"] if f.get("required"))
DEVICES = tuple(_SPECS[""]["device"]["choices"])
CHECKPOINTS = tuple(_SPECS["strategy."]["checkpoint"]["choices"])
OFFLOADS = tuple(_SPECS["strategy."]["offload"]["choices"])
# how long the loop keeps the model's output in a variable (memplan's loop.hold-outputs): dropped once the loss
# exists; until backward is done; until the next forward returns and rebinds it (through the optimizer step)
HOLDS = tuple(_SPECS[""]["hold_outputs"]["choices"])
OPTIMIZERS = tuple(_SPECS[""]["optimizer"]["choices"])
_SCALARS = {k: re.compile(v) for k, v in TABLE["scalars"].items()}
_LIMITS = TABLE["limits"]


class WorkloadError(ValueError):
    """A refusal of a workload file, on one line whatever the file holds: a tag or key quoted from it may hold a
    line break (workload.FuzzParse's tag "!0%0A" is "!0" and a newline), written as \\n and \\r, as the Go
    reader's bad() writes it (workload/workload.go)."""

    def __init__(self, msg):
        super().__init__(str(msg).replace("\n", "\\n").replace("\r", "\\r"))


def _describe(v):
    """v's kind, as the Go reader's describe names it."""
    if v is None:
        return "null"
    for t, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                    (list, "a list"), (dict, "a mapping")):
        if isinstance(v, t):
            return name
    return "a " + type(v).__name__


def _quote(s):
    """s as a JSON string (one line whatever it holds), as the Go reader's quote writes it."""
    return json.dumps(s, ensure_ascii=False)


def _article(t):
    return "an integer" if t == "integer" else "a " + t


def _field_error(f, v):
    """Why v is not a value of field f ("must be ..."), or None."""
    t = _TYPES[f["type"]]
    if not isinstance(v, t) or (isinstance(v, bool) and t is not bool):
        return "must be %s, got %s" % (_article(f["type"]), _describe(v))
    if t is int:
        if "min" in f and v < f["min"]:
            return "must be >= %d, got %d" % (f["min"], v)
        if "max" in f and v > f["max"]:
            return "must be <= %d, got %d" % (f["max"], v)
    if t is str and f.get("choices") is not None and v not in f["choices"]:
        return "must be one of %s, got %s" % (", ".join(f["choices"]), _quote(v))
    return None


def _check(where, obj, spec, prefix):
    if not isinstance(obj, dict):
        raise WorkloadError("%s: must be a mapping, got %s" % (where, _describe(obj)))
    fields = _SPECS[prefix]
    out = {}
    for k in sorted(obj):
        v = obj[k]
        if k not in fields:
            raise WorkloadError("%s: unknown field '%s' (known fields: %s)" % (where, k, ", ".join(sorted(fields))))
        if v is None:
            continue
        why = _field_error(fields[k], v)
        if why:
            top = where[:-len(": strategy")] if where.endswith(": strategy") else where
            raise WorkloadError("%s: field '%s%s' %s" % (top, prefix, k, why))
        out[k] = v
    for k, f in fields.items():
        if out.get(k) is None:
            out[k] = f.get("default")
        if out[k] is None and f.get("required"):
            raise WorkloadError("%s: missing required field '%s%s'" % (where, prefix, k))
    return out


def validate(obj, where="workload"):
    """Validates a workload mapping against the field table and returns it normalised with defaults filled."""
    w = _check(where, obj, _TOP, "")
    s = _check(where + ": strategy", w["strategy"] or {}, _STRATEGY, "strategy.")
    if w["schema"] != SCHEMA:
        raise WorkloadError("%s: field 'schema' must be %s, got %s" % (where, _quote(SCHEMA), _quote(w["schema"])))
    if ":" not in w["model"]:
        raise WorkloadError("%s: field 'model' must be MODULE:FUNCTION, got %s" % (where, _quote(w["model"])))
    try:
        compat.parse_dtype(w["dtype"])
    except ValueError as e:
        raise WorkloadError("%s: field 'dtype': %s" % (where, e))
    if w["batch"] % s["accumulation"]:
        raise WorkloadError("%s: field 'batch' (%d) must be divisible by 'strategy.accumulation' (%d)"
                            % (where, w["batch"], s["accumulation"]))
    if w["model_args"] is None:
        w["model_args"] = {}
    w["strategy"] = s
    if w["name"] is None:
        w["name"] = w["model"].split(":")[-1]
    return w


def _yaml_loader():
    """A PyYAML loader that only composes nodes, tagging every implicit node with its kind (_decode resolves plain
    scalars with the table's patterns, as the Go reader does), or None without PyYAML."""
    try:
        import yaml
    except ImportError:
        return None

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {}

        def resolve(self, kind, value, implicit):
            if kind is yaml.ScalarNode:
                return "memplan:plain" if implicit[0] else "memplan:quoted"
            return "memplan:map" if kind is yaml.MappingNode else "memplan:seq"

    return Loader


class _Decoder:
    """Turns composed YAML nodes into values as workload/yaml.go's converter does: plain scalars by the table's
    patterns (null, booleans, decimal integers, floats; anything else a string), quoted ones as strings, aliases
    expanded (counted), and explicit tags, merge keys, duplicate keys and keys that are not strings refused."""

    def __init__(self, where):
        self.where, self.count = where, 0

    def fail(self, msg):
        raise WorkloadError("%s: %s" % (self.where, msg))

    def value(self, n, path, depth):
        import yaml
        self.count += 1
        if self.count > _LIMITS["values"]:
            self.fail("the document expands to over %d values (aliases included)" % _LIMITS["values"])
        if depth > _LIMITS["depth"]:
            self.fail("%s nests deeper than %d levels" % (_field_name(path), _LIMITS["depth"]))
        if not n.tag.startswith("memplan:"):
            self.fail("%s has an explicit YAML tag (%s); write the value plainly"
                      % (_field_name(path), n.tag.replace("tag:yaml.org,2002:", "!!")))
        if isinstance(n, yaml.MappingNode):
            return self.mapping(n, path, depth)
        if isinstance(n, yaml.SequenceNode):
            return [self.value(e, path, depth + 1) for e in n.value]
        return self.scalar(n, path)

    def mapping(self, n, path, depth):
        out = {}
        for kn, vn in n.value:
            if kn.tag == "memplan:plain" and kn.value == "<<":
                self.fail("merge keys ('<<') are not supported; write the fields out")
            k = self.value(kn, path, depth + 1)
            if not isinstance(k, str):
                self.fail("a mapping key must be a string, got %s" % _describe(k))
            name = path + "." + k if path else k
            if k in out:
                self.fail("field '%s' is given twice" % name)
            out[k] = self.value(vn, name, depth + 1)
        return out

    def scalar(self, n, path):
        s = n.value
        if n.tag != "memplan:plain":
            return s
        if _SCALARS["null"].match(s):
            return None
        if _SCALARS["bool"].match(s):
            return s.lower() == "true"
        if _SCALARS["int"].match(s):
            try:
                return int(s)
            except ValueError:  # Python's limit on int() of a string (4,300 digits)
                self.fail("%s is an integer of %d digits, past any limit" % (_field_name(path), len(s)))
        if _SCALARS["float"].match(s):
            t = s.lower().lstrip("+-")
            f = float("nan") if t == ".nan" else float("inf") if t == ".inf" else float(s)
            if math.isinf(f) or math.isnan(f):
                self.fail("%s must be a finite number, got %s (JSON has no infinities or NaN)" % (_field_name(path), s))
            return f
        return s


def _field_name(path):
    return "field '%s'" % path if path else "the document"


def decode_yaml(text, where):
    """The one YAML document of text as plain values (see _Decoder); several documents are refused."""
    import yaml
    # Explicit tags are refused before they construct anything; the node's own tag says which.
    try:
        docs = list(yaml.compose_all(text, Loader=_yaml_loader()))
    except yaml.YAMLError as e:
        raise WorkloadError("%s: invalid YAML: %s" % (where, " ".join(str(e).split())))
    except RecursionError:
        # PyYAML composes recursively: 1,000 nested [ overflow the stack before _Decoder counts levels
        raise WorkloadError("%s: the document nests deeper than %d levels" % (where, _LIMITS["depth"]))
    if not docs:
        return None
    if len(docs) > 1:
        raise WorkloadError("%s: holds %d YAML documents; a workload is one" % (where, len(docs)))
    return _Decoder(where).value(docs[0], "", 0)


def _json_pairs(where):
    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise WorkloadError("%s: field '%s' is given twice" % (where, k))
            out[k] = v
        return out
    return hook


# what a path that is not a regular file is, in the Go reader's words (internal/boundedio kind)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _read(path):
    """The bytes of the regular file at path, at most the table's limit, as Go's boundedio.ReadFile reads them: a
    named pipe is refused without blocking (O_NONBLOCK), a device such as /dev/zero without reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise WorkloadError("%s: %s" % (path, e.strerror or e))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((k for t, k in _KINDS if t(mode)), "mode %o" % mode)
        raise WorkloadError("cannot read %s: not a regular file (%s)" % (path, kind))
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(_LIMITS["bytes"] + 1)
        except OSError as e:
            raise WorkloadError("%s: %s" % (path, e.strerror or e))


def load(path):
    """Reads a YAML or JSON workload file and validates it. JSON is YAML, so a .json file takes the YAML path too,
    as the Go reader's does (the table's count, depth and scalar rules apply to both); the json module only
    without PyYAML."""
    where = os.path.basename(path)
    data = _read(path)
    if len(data) > _LIMITS["bytes"]:
        raise WorkloadError("%s: is over the limit of %d bytes for a workload file" % (where, _LIMITS["bytes"]))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorkloadError("%s: is not UTF-8 text (byte %d)" % (where, e.start))
    if _yaml_loader() is None:
        try:
            obj = json.loads(text, object_pairs_hook=_json_pairs(where), parse_constant=_no_constant(where))
        except ValueError as e:
            if isinstance(e, WorkloadError):
                raise
            if not path.endswith(".json"):
                raise WorkloadError("%s: PyYAML is not installed (apt-get install python3-yaml); "
                                    "write the workload as JSON instead" % where)
            raise WorkloadError("%s: invalid JSON: %s" % (where, e))
    else:
        obj = decode_yaml(text, where)
    return validate(obj, where)


def _no_constant(where):
    def refuse(name):
        raise WorkloadError("%s: invalid JSON: %s is not a number" % (where, name))
    return refuse
