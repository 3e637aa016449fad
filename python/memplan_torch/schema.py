"""Checks a memplan.trace/v1 or memplan.measured/v1 document: fields, types and invariants."""

from . import fit
from .replay import storage_bytes

CATEGORIES = ("parameter", "gradient", "optimizer_state", "input", "activation", "temporary")
PHASES = ("forward", "backward", "optimizer")


class SchemaError(ValueError):
    pass


def _need(obj, where, fields):
    for name, types in fields:
        if name not in obj:
            raise SchemaError("%s: missing field %r" % (where, name))
        if not isinstance(obj[name], types) or (isinstance(obj[name], bool) and bool not in types
                                                 and int in types):
            raise SchemaError("%s: field %r has type %s" % (where, name, type(obj[name]).__name__))


_STORAGE = [("id", (int,)), ("bytes", (int,)), ("bytes_const", (int,)), ("bytes_per_batch", (int,)),
            ("dtype", (str,)), ("shape", (list,)), ("category", (str,)), ("saved", (bool,))]
_EVENT = [("index", (int,)), ("op", (str,)), ("phase", (str,)), ("module", (str,)), ("alloc", (list,)),
          ("free", (list,)), ("saved", (list,)), ("outputs", (list,))]


def _storage(s, where, doc):
    _need(s, where, _STORAGE)
    if s["category"] not in CATEGORIES:
        raise SchemaError("%s: category %r not one of %s" % (where, s["category"], ", ".join(CATEGORIES)))
    if storage_bytes(s, doc["trace_batch"], doc.get("trace_seq")) != s["bytes"]:
        raise SchemaError("%s: the size model does not give 'bytes' at the trace batch" % where)


def _flops(e, where, doc):
    """An event's FLOPs: a whole number, not negative, that its model (flops_const, flops_per_batch and, with
    seq_dim, the sequence terms) gives at the trace batch."""
    terms = ["flops_const", "flops_per_batch"]
    if doc.get("seq_dim") is not None:
        terms += ["flops_per_seq", "flops_per_seq2", "flops_per_batch_seq", "flops_per_batch_seq2"]
    _need(e, where, [("flops", (int,))] + [(t, (int,)) for t in terms])
    if e["flops"] < 0:
        raise SchemaError("%s: negative flops %d" % (where, e["flops"]))
    if fit.bytes_at(e, doc["trace_batch"], doc.get("trace_seq") if doc.get("seq_dim") is not None else None,
                    quantity="flops") != e["flops"]:
        raise SchemaError("%s: the FLOPs model does not give 'flops' at the trace batch" % where)


def _param_grads(doc):
    """v2's param_grads: each an initial parameter (not a buffer) and a gradient storage of the document."""
    _need(doc, "trace", [("param_grads", (list,))])
    params = {s["id"] for s in doc["initial_storages"] if s["category"] == "parameter" and not s.get("buffer")}
    grads = {a["id"] for e in doc["events"] for a in e["alloc"] if a["category"] == "gradient"}
    grads |= {s["id"] for s in doc["initial_storages"] if s["category"] == "gradient"}
    seen = set()
    for i, pg in enumerate(doc["param_grads"]):
        w = "param_grads[%d]" % i
        if not isinstance(pg, dict):
            raise SchemaError("%s: not an object" % w)
        _need(pg, w, [("param", (int,)), ("grad", (int,))])
        if pg["param"] not in params or pg["param"] in seen:
            raise SchemaError("%s: param %r is not a parameter's storage listed once" % (w, pg["param"]))
        seen.add(pg["param"])
        if pg["grad"] not in grads:
            raise SchemaError("%s: grad %r is not a gradient storage" % (w, pg["grad"]))


def validate_trace(doc):
    """Raises SchemaError on the first problem; returns the number of events."""
    if not isinstance(doc, dict):
        raise SchemaError("trace: not an object")
    _need(doc, "trace", [("schema", (str,)), ("trace_batch", (int,)), ("initial_storages", (list,)),
                         ("events", (list,)), ("first_step", (dict,)), ("end_live", (list,)),
                         ("trace_device", (str,)), ("producer", (dict,))])
    if doc["schema"] not in ("memplan.trace/v1", "memplan.trace/v2"):
        raise SchemaError("trace: schema is %r, not memplan.trace/v1 or v2" % doc["schema"])
    live = set()
    seen = set()
    for s in doc["initial_storages"]:
        _storage(s, "initial storage %s" % s.get("id"), doc)
        if s["id"] in seen:
            raise SchemaError("initial storage %d listed twice" % s["id"])
        seen.add(s["id"])
        live.add(s["id"])

    def walk(events, live, where):
        last_phase = 0
        for i, e in enumerate(events):
            w = "%s event %d" % (where, i)
            _need(e, w, _EVENT)
            if e["index"] != i:
                raise SchemaError("%s: index is %d" % (w, e["index"]))
            if e["phase"] not in PHASES:
                raise SchemaError("%s: phase %r" % (w, e["phase"]))
            if PHASES.index(e["phase"]) < last_phase:
                raise SchemaError("%s: phase %s after %s" % (w, e["phase"], PHASES[last_phase]))
            last_phase = PHASES.index(e["phase"])
            if "flops" in e:
                _flops(e, w, doc)
            for a in e["alloc"]:
                _storage(a, w + " alloc %s" % a.get("id"), doc)
                if a["id"] in live:
                    raise SchemaError("%s: allocates storage %d which is live" % (w, a["id"]))
                live.add(a["id"])
            for o in e["outputs"]:
                if o["storage"] not in live:
                    raise SchemaError("%s: output storage %d is not live" % (w, o["storage"]))
            for f in e["free"]:
                if f not in live:
                    raise SchemaError("%s: frees storage %d which is not live" % (w, f))
                live.discard(f)

    steady = set(live)
    walk(doc["events"], steady, "steady")
    if sorted(steady) != sorted(doc["end_live"]):
        raise SchemaError("trace: storages live after the last event %s differ from end_live %s"
                          % (sorted(steady)[:10], sorted(doc["end_live"])[:10]))
    fs = doc["first_step"]
    _need(fs, "first_step", [("optimizer_state", (list,)), ("optimizer_events", (list,)), ("exact", (bool,))])
    if doc["schema"] == "memplan.trace/v2":
        _param_grads(doc)
    mo = doc.get("model_output")
    if mo is not None:
        _need(mo, "model_output", [("storages", (list,)), ("returned_at", (int,))])
        r = mo["returned_at"]
        if not -1 <= r < len(doc["events"]) or (r >= 0 and doc["events"][r]["phase"] != "forward"):
            raise SchemaError("model_output: returned_at %r is not the index of a forward event" % (r,))
        made = {a["id"] for e in doc["events"][:r + 1] for a in e["alloc"]}
        for sid in mo["storages"]:
            if sid not in made:
                raise SchemaError("model_output: storage %r is not allocated by the forward before event %d" % (sid, r))
        if mo.get("hold", "none") not in ("none", "backward", "next-forward"):
            raise SchemaError("model_output: hold %r is not none, backward or next-forward" % (mo["hold"],))
    return len(doc["events"])


def validate_measured(doc):
    _need(doc, "measured", [("schema", (str,)), ("cases", (list,))])
    if doc["schema"] != "memplan.measured/v1":
        raise SchemaError("measured: schema is %r" % doc["schema"])
    for c in doc["cases"]:
        w = "case %s" % c.get("name")
        _need(c, w, [("name", (str,)), ("workload", (dict,)), ("device", (str,)), ("phases", (dict,)),
                     ("peak_bytes", (int,)), ("peak_phase", (str,)), ("baseline_bytes", (int,)),
                     ("first_step", (dict,)), ("step_time_s", (float, int))])
        for p in PHASES:
            if not isinstance(c["phases"].get(p), int):
                raise SchemaError("%s: phases.%s missing" % (w, p))
        if c["peak_bytes"] != max(c["phases"].values()):
            raise SchemaError("%s: peak_bytes is not the largest phase peak" % w)
    return len(doc["cases"])
