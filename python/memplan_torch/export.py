"""Exports a memplan.trace/v1 JSON file (see docs/trace-format.md).

Sizes that scale with the batch (and the sequence, when a seq_dim is named) are found by tracing at
several sizes and matching the traces op by op; each storage size is then fitted exactly with integer
coefficients.
"""

import contextlib
import copy
import sys
import time
import torch

from . import atomic, collector, compat, fit, flops, harness
from .replay import scratch_bytes
from .trace import ExportError, InputDimError, _categorize, trace_once

SCHEMA = "memplan.trace/v2"  # v2: param_grads
SEQ_TERMS = fit.SEQ_TERMS


def _steady(raw):
    rec = raw["recorder"]
    m = raw["marks"]
    return rec.events[m["step2"]:m["end"]]


def _canonical(raw):
    return fit.canonical(_steady(raw), raw["initial"])


def _aligned(raws, alignments):
    """field(key, i, name): the value `name` (0 when absent) of event i of the structure trace at fit point key,
    where it is event event_map()[i] (0 for an op a view replaced there: no kernel, no scratch, no FLOPs)."""
    evs = {key: _steady(raw) for key, raw in raws.items()}
    at = {key: (alignments[key].event_map() if key in alignments else None) for key in raws}

    def field(key, i, name):
        j = i if at[key] is None else at[key].get(i)
        return evs[key][j].get(name, 0) if j is not None else 0
    return field


def _fit_flops(steady, base_events, field, raws, batches, seqs, batch, want_seq):
    """Gives each steady event that PyTorch counts FLOPs for (flops.op_flops) its FLOPs at the document's batch
    (and sequence) and their exact fit over the traced points, as a storage's size: a matrix product's are
    linear in the batch and at most quadratic in the sequence (attention). field is _aligned's."""
    flops_at = lambda key, i: field(key, i, "flops")
    counted = [i for i in range(len(base_events)) if any(flops_at(k, i) for k in raws)]
    label = lambda i: "the FLOPs of %s" % fit.describe(base_events[i])
    models = fit.size_models(flops_at, batches, seqs, counted, label, quantity="flops")
    for i, m in models.items():
        n = fit.bytes_at(m, batch, want_seq, quantity="flops")
        if n < 0:
            raise ExportError("memplan_torch: %s are %d at batch %d by their fit over batch %s: export at batch %d"
                              % (label(i), n, batch, "/".join(map(str, batches)), batches[0]))
        steady[i]["flops"] = n
        steady[i].update(m)


def _scratch_below(make_job, batch, batches, seqs, optimizer, dev, foreach, base_events):
    """In-kernel scratch at a batch below the traced ones (1): {seq: {event index: bytes}}, or {} when the
    batch asked for is traced.

    Scratch is not a function of the batch that a line through batch 2 and 4 extends to 1: oneDNN splits a
    convolution's weight gradient over min(batch, threads) threads, each with its own buffer (ViT-B/16's
    patch embedding on two cores: 1.3 MB of scratch at batch 1, 2.5 MB at 2 and 4). So the step is traced once
    more at the batch asked for, only for its scratch: the k-th run of an op in a module and phase there is the
    k-th one of the traced structure, for the ops that run as often in both (a size-1 path that adds or drops
    a view changes no kernel's scratch; an op that runs a different number of times keeps the fitted line)."""
    if batch >= batches[0]:
        return {}
    out = {}
    for s in (seqs or [None]):
        job = make_job(batch, s)
        harness.to_device(job, dev)
        raw = _traceable(job, optimizer, dev, foreach)
        if not raw["scratch_measured"]:
            return {}

        def runs(events):
            seen, keys = {}, []
            for e in events:
                k = (e["op"], e["phase"], e["module"])
                keys.append((k, seen.get(k, 0)))
                seen[k] = seen.get(k, 0) + 1
            return keys, seen

        small_keys, small_count = runs(_steady(raw))
        by_run = {kn: e.get("scratch", 0) for kn, e in zip(small_keys, _steady(raw))}
        base_keys, base_count = runs(base_events)
        out[s] = {i: by_run[kn] for i, kn in enumerate(base_keys) if small_count.get(kn[0]) == base_count[kn[0]]}
    return out


def _align_all(raws, base_key):
    """fit.align of the trace at base_key with each other one: {key: fit.Alignment}."""
    base = raws[base_key]
    base_canon, _ = _canonical(base)
    out = {}
    for key, raw in raws.items():
        if key == base_key:
            continue
        if len(raw["initial"]) != len(base["initial"]):
            raise ExportError("memplan_torch: %d storages are alive at the start of the step at %s but %d "
                              "at %s" % (len(base["initial"]), _point(base_key), len(raw["initial"]), _point(key)))
        out[key] = fit.align(base_canon, _canonical(raw)[0], "%s and %s" % (_point(base_key), _point(key)))
    return out


def _regions_text(a, b, al, most=3):
    """The first aliasing substitutions of an alignment, as 'op+op vs op' with the module."""
    ea, eb = _steady(a), _steady(b)
    out = []
    for (i0, i1), (j0, j1) in al.regions[:most]:
        x = "+".join(e["op"].replace("aten.", "").replace(".default", "") for e in ea[i0:i1]) or "nothing"
        y = "+".join(e["op"].replace("aten.", "").replace(".default", "") for e in eb[j0:j1]) or "nothing"
        mod = (ea[i0:i1] or eb[j0:j1])[0]["module"] or "<root>"
        out.append("%s vs %s in %r" % (x, y, mod))
    if len(al.regions) > most:
        out.append("%d more" % (len(al.regions) - most))
    return ", ".join(out)


def describe_storage(raw, sid):
    r = raw["recorder"].storages[sid]
    return "the storage allocated by %s in module %r" % (r.op or "(before the step)", r.module or "<root>")


def _point(key):
    return "batch %d" % key[0] + (" seq %d" % key[1] if key[1] is not None else "")


def _first_opt_allocs(raw):
    rec = raw["recorder"]
    m = raw["marks"]
    return [s for e in rec.events[m["step1"]:m["step2"]] if e["phase"] == "optimizer" for s in e["alloc"]]


def _first_step_map(raw):
    """Maps step-1 storage ids to step-2 ids through the aligned forward/backward events."""
    rec = raw["recorder"]
    m = raw["marks"]
    s1 = [e for e in rec.events[m["step1"]:m["step2"]] if e["phase"] != "optimizer"]
    s2 = [e for e in rec.events[m["step2"]:m["end"]] if e["phase"] != "optimizer"]
    if len(s1) != len(s2) or any(x["op"] != y["op"] for x, y in zip(s1, s2)):
        return None
    mapping = {}
    for x, y in zip(s1, s2):
        if len(x["alloc"]) != len(y["alloc"]):
            return None
        for a, b in zip(x["alloc"], y["alloc"]):
            mapping[a] = b
    return mapping


def _traceable(job, optimizer, device, foreach):
    return trace_once(job, optimizer=optimizer, device=device, foreach=foreach)


FAKE_NOTE = ("traced under FakeTensorMode (fake cpu tensors): nothing computed or allocated; in-kernel "
             "scratch not measured")


def _check_fake(device):
    if not compat.fake_tensors_available():
        raise ExportError("memplan_torch: fake execution needs PyTorch 2.x (this is torch %s); export with "
                          "--real" % compat.TORCH_VERSION)
    if device not in ("auto", "cpu"):
        raise ExportError("memplan_torch: fake execution traces fake cpu tensors; --device %s does not apply "
                          "(the meta device already computes nothing; use --device auto or cpu with --fake)"
                          % device)


def _fake_trace(make_fake_job, b, s, optimizer, foreach, notes, prime=None):
    fm = compat.new_fake_mode()
    job, note = make_fake_job(b, s, fm)
    if note and note not in notes:
        notes.append(note)
    # a transformers model reads FakeTensors as tracing and would build the causal mask a real step does not:
    # make it decide as on real tensors (hf.real_mask_decisions; only when the builder imported transformers)
    ctx = contextlib.nullcontext()
    if "transformers.masking_utils" in sys.modules:
        from .hf import real_mask_decisions
        ctx = real_mask_decisions()
    try:
        with ctx:
            return trace_once(job, optimizer=optimizer, device="cpu", foreach=foreach, fake_mode=fm, prime=prime)
    except ExportError:
        raise
    except (RuntimeError, NotImplementedError, TypeError) as e:
        raise ExportError("memplan_torch: the training step failed under fake tensors: %s: %s; export "
                          "with --real --device cpu (fake=False, device='cpu') to run it for real"
                          % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))


def _steady_shape(raw):
    """What a primed trace must share with the structure point's full one: the steady step's ops, phases,
    modules, and its allocations, frees and saves as canonical ids, and the number of storages alive before it."""
    canon, _ = fit.canonical(_steady(raw), raw["initial"])
    return len(raw["initial"]), [(e["op"], e["phase"], e["module"], sorted(e["alloc"]), sorted(e["free"]),
                                  sorted(e["saved"])) for e in canon]


def _run_fake_traces(make_fake_job, batches, seqs, optimizer, foreach):
    """Traces at every (batch, seq) point on fake cpu tensors, one FakeTensorMode per point.

    The first point (fit.fit_points puts the structure point first) runs two whole steps. The others only need
    their steady step's sizes: their first step is primed (trace_once's prime: an optimizer step on gradients
    of the parameters the first point found with gradients, no forward or backward), which saves a forward
    and backward per point (5 of 12 with a sequence fit). A primed trace whose steady step does not have the
    first point's structure (a module that builds something in its first forward) is traced again whole."""
    raws = {}
    notes = [FAKE_NOTE]
    first = None
    for s in (seqs or [None]):
        for b in batches:
            if first is None:
                first = raws[(b, s)] = _fake_trace(make_fake_job, b, s, optimizer, foreach, notes)
                shape = _steady_shape(first)
                continue
            try:
                raw = _fake_trace(make_fake_job, b, s, optimizer, foreach, notes, prime=first["with_grad"])
                if _steady_shape(raw) != shape:
                    raw = None
            except ExportError:
                raw = None
            raws[(b, s)] = raw or _fake_trace(make_fake_job, b, s, optimizer, foreach, notes)
    return raws, "cpu", notes


def _run_traces(make_job, batches, seqs, optimizer, device, foreach):
    """Traces at every (batch, seq) point on `device` ('auto': meta, then cpu)."""
    devices = ["meta", "cpu"] if device == "auto" else [device]
    notes = []
    last = None
    for dev in devices:
        try:
            raws = {}
            for s in (seqs or [None]):
                for b in batches:
                    job = make_job(b, s)
                    harness.to_device(job, dev)
                    raws[(b, s)] = _traceable(job, optimizer, dev, foreach)
            return raws, dev, notes
        except ExportError as e:
            if device != "auto" or dev == devices[-1] or "do not align" in str(e) or isinstance(e, InputDimError):
                raise
            notes.append("meta device failed, traced on cpu: %s" % e)
            last = e
        except (RuntimeError, NotImplementedError, TypeError) as e:
            if device != "auto" or dev == devices[-1]:
                raise ExportError("memplan_torch: the training step failed on %s: %s: %s" % (dev, type(e).__name__, e))
            notes.append("meta device failed, traced on cpu: %s: %s" % (type(e).__name__, e))
            last = e
    raise last  # pragma: no cover


def build_trace(make_job, batch, seq_len=None, optimizer="adamw", device="auto", foreach=None,
                batch_dim=0, seq_dim=None, name=None, source=None, make_fake_job=None):
    """Builds the trace document. make_job(batch, seq) returns a fresh harness.Job; with make_fake_job
    (batch, seq, fake_mode) -> (job of FakeTensors, note or None) the step runs under fake tensors.
    The bookkeeping runs with Python's collector paused, each step as the caller had it (memplan_torch.collector)."""
    with collector.paused():
        return _build_trace(make_job, batch, seq_len, optimizer, device, foreach, batch_dim, seq_dim, name, source,
                            make_fake_job)


def _build_trace(make_job, batch, seq_len, optimizer, device, foreach, batch_dim, seq_dim, name, source,
                 make_fake_job):
    t0 = time.time()
    batches, seqs, base_key = fit.fit_points(batch, seq_len, seq_dim)
    if make_fake_job is not None:
        raws, dev, notes = _run_fake_traces(make_fake_job, batches, seqs, optimizer, foreach)
    else:
        raws, dev, notes = _run_traces(make_job, batches, seqs, optimizer, device, foreach)
    want_seq = seq_len if seqs else None
    if base_key != (batch, want_seq):
        notes.append("asked for batch %d%s: traced at batch %s%s (sizes of 1 take PyTorch's size-1 fast paths, "
                     "views where larger sizes copy); the events and shapes are those at batch %d%s, every size "
                     "is the fitted size model at batch %d%s" % (
                         batch, " seq %d" % seq_len if seqs else "", "/".join(map(str, batches)),
                         " seq " + "/".join(map(str, sorted(seqs))) if seqs else "", base_key[0],
                         " seq %d" % base_key[1] if seqs else "", batch, " seq %d" % seq_len if seqs else ""))
    alignments = _align_all(raws, base_key)
    if any(al.regions for al in alignments.values()):
        # the traces differ in aliasing (a view at one size, a copy of the same elements at another): the trace
        # at the largest fit point decides what is allocated, since PyTorch takes the view paths at the small
        # sizes (a dimension of 1 inside the model) and the copies at every larger one; its copies are sized at
        # the other points by the elements the view there covers (fit.Alignment)
        big = max(raws, key=lambda k: (k[0], k[1] or 0))
        notes.append("the traces at %s and %s differ only in aliasing (%s): the events are those at %s, where "
                     "PyTorch copies; each copy is sized at the other points by the elements it copies" % (
                         _point(base_key), ", ".join(_point(k) for k, al in alignments.items() if al.regions),
                         "; ".join(_regions_text(raws[base_key], raws[k], al) for k, al in alignments.items()
                                   if al.regions), _point(big)))
        base_key = big
        alignments = _align_all(raws, base_key)
    base = raws[base_key]
    base_events = _steady(base)
    base_canon, base_ids = _canonical(base)
    base_inv = {v: k for k, v in base_ids.items()}
    # sid_at[key][base sid] = the same storage's sid in the trace at key; derived[key][base sid] = the bytes of a
    # storage the base trace copies where the trace at key views
    sid_at, derived = {}, {}
    for key, raw in raws.items():
        canon, ids = _canonical(raw)
        inv = {v: k for k, v in ids.items()}
        al = alignments.get(key)
        if al is None or not al.regions:
            sid_at[key] = {base_inv[c]: inv[c] for c in base_inv if c in inv}
        else:
            sid_at[key] = {base_inv[c]: inv[al.smap.get(c, c)] for c in base_inv
                           if c in al.smap or (c not in al.only_a and c in inv and c < len(raw["initial"]))}
        derived[key] = {}
        for c, how in (al.only_a.items() if al is not None else ()):
            if how is None:
                raise ExportError("memplan_torch: %s copies where the trace at %s views, and nothing there gives "
                                  "the bytes it copies" % (describe_storage(base, base_inv[c]), _point(key)))
            kind, what = how
            if kind == "shape":
                shape, dt = what
                n = 1
                for d in shape:
                    n *= d
                derived[key][base_inv[c]] = n * torch.empty((), dtype=getattr(torch, dt)).element_size()
            else:
                derived[key][base_inv[c]] = ("storage", inv[what])
        fa, fb = _first_opt_allocs(base), _first_opt_allocs(raw)
        if len(fa) != len(fb):
            raise ExportError("memplan_torch: the first optimizer step allocates %d storages at %s but %d at %s"
                              % (len(fa), _point(base_key), len(fb), _point(key)))
        for x, y in zip(fa, fb):
            sid_at[key].setdefault(x, y)
    rec = base["recorder"]
    m = base["marks"]

    # storages the document mentions
    steady_alloc = []
    for e in base_events:
        steady_alloc.extend(e["alloc"])
    steady_alloc_set = set(steady_alloc)
    initial = list(base["initial"])
    initial_set = set(initial)
    mentioned = set()
    for e in base_events:
        mentioned.update(e["free"])
        mentioned.update(e["saved"])
        mentioned.update(o["storage"] for o in e["outputs"])
        mentioned.update(e.get("inputs", ()))
    for sid in sorted(mentioned - steady_alloc_set - initial_set):
        if rec.storages[sid].sid >= 0:
            initial.append(sid)  # pre-existing storages first seen during the step
            initial_set.add(sid)

    fmap = _first_step_map(base)
    first_events = [e for e in rec.events[m["step1"]:m["step2"]] if e["phase"] == "optimizer"]
    first_alloc = []
    for e in first_events:
        first_alloc.extend(e["alloc"])

    # renumber: initial, then steady allocations, then first-step-only
    order = sorted(initial) + steady_alloc + [s for s in first_alloc if s not in initial_set]
    newid = {}
    for s in order:
        if s not in newid:
            newid[s] = len(newid)

    def remap1(s):  # first-step id -> document id
        if fmap is not None and s in fmap:
            return newid.get(fmap[s])
        return newid.get(s)

    label_of = lambda sid: "the storage allocated by %s in module %r" % (
        rec.storages[sid].op or "(before the step)", rec.storages[sid].module or "<root>")

    def nbytes(key, sid):
        d = derived.get(key, {}).get(sid)
        if d is not None:
            return raws[key]["recorder"].storages[d[1]].nbytes if isinstance(d, tuple) else d
        if sid not in sid_at[key]:
            raise ExportError("memplan_torch: %s has no counterpart in the trace at %s (the traces differ in "
                              "aliasing around it)" % (label_of(sid), _point(key)))
        return raws[key]["recorder"].storages[sid_at[key][sid]].nbytes

    sizes = fit.size_models(nbytes, batches, seqs, sorted(set(order)), label_of)
    for sid, sm in sizes.items():
        n = fit.bytes_at(sm, batch, want_seq)
        if n < 0:
            raise ExportError("memplan_torch: %s has %d bytes at batch %d%s by its size model (fitted at batch "
                              "%s): the model does not extrapolate to the size asked for; export at batch %d"
                              % (label_of(sid), n, batch, " seq %d" % want_seq if seqs else "",
                                 "/".join(map(str, batches)), batches[0]))

    cats = {}
    for s in set(order):
        cats[s] = _categorize(rec.storages[s], base["params"], base["buffers"], base["grads"],
                              base["states"], base["inputs"])

    def storage_obj(sid):
        r = rec.storages[sid]
        o = {"id": newid[sid], "bytes": fit.bytes_at(sizes[sid], batch, want_seq)}
        o.update(sizes[sid])
        o.update({"dtype": r.dtype, "shape": list(r.shape), "category": cats[sid], "saved": r.saved})
        if sid in base["buffers"]:
            o["buffer"] = True
        if r.module:
            o["module"] = r.module
        return o

    def event_obj(i, e, remap):
        def ids(lst):
            return [x for x in (remap(s) for s in lst) if x is not None]
        return {"index": i, "op": e["op"], "phase": e["phase"], "module": e["module"],
                "alloc": [dict(storage_obj(s), id=remap(s)) for s in e["alloc"]],
                "free": ids(e["free"]),
                "saved": ids(e["saved"]),
                "inputs": ids(e.get("inputs", ())),
                "outputs": [{"storage": remap(o["storage"]), "dtype": o["dtype"], "shape": list(o["shape"]),
                             "alias": o["alias"], "inplace": o["inplace"]} for o in e["outputs"]]}

    steady = [event_obj(i, e, newid.get) for i, e in enumerate(base_events)]
    field = _aligned(raws, alignments)
    scratch_measured = all(r["scratch_measured"] for r in raws.values())
    if scratch_measured:
        scratch_at = lambda k, i: field(k, i, "scratch")
        small = _scratch_below(make_job, batch, batches, seqs, optimizer, dev, foreach, base_events)
        for i, ev in enumerate(steady):
            pts = [[k[0], k[1], scratch_at(k, i)] for k in sorted(raws, key=lambda k: (k[1] or 0, k[0]))]
            # the point below the fit is listed last: readers that take the first two points per sequence
            # length (memplan before it) keep the fit's line
            pts += [[batch, s, y[i]] for s, y in small.items() if y.get(i) is not None]
            if any(p[2] for p in pts):
                ev["scratch"] = {"bytes": 0, "points": pts}
                ev["scratch"]["bytes"] = scratch_bytes(ev, batch, want_seq)
    if flops.available():
        _fit_flops(steady, base_events, field, raws, batches, seqs, batch, want_seq)
    first = [event_obj(i, e, remap1) for i, e in enumerate(first_events)]
    state_ids = sorted(newid[s] for s in initial if cats[s] == "optimizer_state")

    phases = {}
    for ev in steady:
        ph = phases.setdefault(ev["phase"], [ev["index"], ev["index"]])
        ph[1] = ev["index"]

    doc = {
        "schema": SCHEMA,
        "name": name,
        "source": source,
        "producer": {"tool": "memplan_torch", "torch": compat.TORCH_VERSION, "elapsed_s": 0.0},
        "trace_device": dev,
        "execution": "fake" if make_fake_job is not None else "real",
        "notes": notes,
        "optimizer": optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom"),
        "foreach": foreach,
        "batch_dim": batch_dim,
        "seq_dim": seq_dim,
        "trace_batch": batch,
        # the length the builder ran at, even when sizes are not fitted in it (no seq_dim): memplan replays
        # such a trace at that length only, and checks a workload's seq_len against it
        "trace_seq": seq_len,
        "traced_at": {"batch": base_key[0], "seq": base_key[1]},
        "fit_points": [{"batch": b, "seq": s} for (b, s) in sorted(raws, key=lambda k: (k[1] or 0, k[0]))],
        "size_model": "bytes = bytes_const + bytes_per_batch*batch" + (
            " + bytes_per_seq*seq + bytes_per_seq2*seq^2 + bytes_per_batch_seq*batch*seq"
            " + bytes_per_batch_seq2*batch*seq^2" if seqs else ""),
        "scratch": "measured" if scratch_measured else "not measured",
        "flops": flops.source(),
        "n_params": base["n_params"],
        "param_bytes": base["param_bytes"],
        "phases": {k: {"first_event": v[0], "last_event": v[1]} for k, v in phases.items()},
        "initial_storages": [storage_obj(s) for s in sorted(initial)],
        "events": steady,
        "end_live": sorted(newid[s] for s in base["end_live"] if s in newid),
        "first_step": {
            "exact": fmap is not None,
            "optimizer_state": state_ids,
            "optimizer_events": first,
        },
    }
    # each parameter's gradient storage (what AccumulateGrad wrote to .grad in the steady step): data parallelism
    # and ZeRO shard a gradient with its parameter (memplan.trace/v2)
    doc["param_grads"] = sorted(({"param": newid[p], "grad": newid[g]} for p, g in base["param_grads"]
                                 if p in newid and g in newid), key=lambda d: d["param"])
    mo = base.get("model_output")
    if mo is not None:
        # the storages the step allocates for the model's output, and the event after which the model returned:
        # a loop that keeps the output in a variable keeps them past the loss (memplan's loop.hold-outputs)
        doc["model_output"] = {"storages": sorted(newid[s] for s in mo[1] if s in steady_alloc_set),
                               "returned_at": mo[0] - m["step2"]}
    doc["producer"]["elapsed_s"] = round(time.time() - t0, 3)
    return doc


def write_json(doc, path, flag="--out"):
    """Writes atomically (memplan_torch.atomic): a temporary file in the target's directory, then rename; a
    symbolic link is written through; nothing is left behind on an error or a signal."""
    atomic.write_json(doc, path, flag)


LOSS_CLOSURE = ("memplan_torch: the loss function failed at %s, where the exporter also traces the step to fit "
                "sizes (the inputs given are %s): %s. A loss whose tensors do not follow the batch (targets "
                "captured by a closure) cannot run there: pass them as targets= (they are repeated and cut "
                "with the inputs), or use the builder form, export_builder / `export MODULE:FUNCTION` with "
                "FUNCTION(batch_size[, seq_len=]) returning (model, inputs, loss_fn, targets)")


def _other_size_loss(loss_fn, b, s, batch, seq_len):
    """loss_fn, failing with LOSS_CLOSURE when it fails at a fit point other than the inputs' own size."""
    at = "batch %d" % b + (" seq %d" % s if s is not None else "")
    given = "batch %d" % batch + (" seq %d" % seq_len if s is not None else "")

    def loss(*a):
        try:
            return loss_fn(*a)
        except Exception as e:
            first = (str(e).splitlines() or [""])[0][:300]
            if isinstance(e, ExportError):  # an op of the loss failed inside the recorder: its own line
                cause = first
            else:
                cause = "%s: %s" % (type(e).__name__, first)
            raise ExportError(LOSS_CLOSURE % (at, given, cause.rstrip("."))) from e
    return loss


def export(model, inputs, path, loss_fn=None, optimizer="adamw", batch_dim=0, seq_dim=None, targets=None,
           device="auto", foreach=None, name=None, fake=False):
    """Traces a training step of `model` on `inputs` (at their batch size) and writes a memplan.trace/v1
    file to `path`. Sizes are fitted from a second trace at twice the batch (inputs and targets are
    repeated along batch_dim); with seq_dim, also from traces at shorter sequences (inputs narrowed along
    seq_dim). fake=True (PyTorch 2.x) runs the step on fake cpu tensors: a copy of the model is converted,
    nothing is computed. Returns the document."""
    atomic.check_out(path)
    if fake:
        _check_fake(device)
    harness.check_dims(inputs, batch_dim, seq_dim)
    model.train()
    batch = harness.batch_size_of(inputs, batch_dim)
    seq_len = None
    if seq_dim is not None:
        seq_len = harness.batch_size_of(inputs, seq_dim)
    proto = compat.deepcopy_module(model).cpu()

    def make_job(b, s):
        m = copy.deepcopy(proto)
        inp = harness.scale_batch(inputs, batch_dim, b // batch) if b != batch else inputs
        tgt = harness.scale_batch(targets, batch_dim, b // batch) if (b != batch and targets is not None) else targets
        if s is not None and s != seq_len:
            inp = harness.narrow_seq(inp, seq_dim, s)
            tgt = harness.narrow_seq(tgt, seq_dim, s) if tgt is not None else None
        lf = loss_fn
        if loss_fn is not None and (b != batch or (s is not None and s != seq_len)):
            lf = _other_size_loss(loss_fn, b, s, batch, seq_len)
        return harness.Job(m, inp, lf, tgt)

    def make_fake_job(b, s, fm):
        return harness.to_fake(make_job(b, s), fm), None

    doc = build_trace(make_job, batch, seq_len, optimizer, device, foreach, batch_dim, seq_dim,
                      name=name or type(model).__name__, source="memplan_torch.export",
                      make_fake_job=make_fake_job if fake else None)
    write_json(doc, path)
    return doc


def export_builder(spec, path, batch=2, seq_len=None, optimizer="adamw", batch_dim=0, seq_dim=None,
                   device="auto", foreach=None, name=None, builder=None, fake=False):
    """Exports from a builder MODULE:FUNCTION; FUNCTION(batch_size[, seq_len=]) returns
    (model, inputs, loss_fn[, targets]). fake=True (PyTorch 2.x): the builder runs under the FakeTensorMode
    (no parameter memory; if it fails there, e.g. an initializer reads values, it runs for real and its
    tensors are converted) and the step runs on fake cpu tensors, computing nothing."""
    atomic.check_out(path)
    fit.fit_points(batch, seq_len, seq_dim)  # bad sizes are refused before the builder runs
    fn = builder or harness.load_builder(spec)
    if fake:
        _check_fake(device)

    def make_job(b, s):
        torch.manual_seed(0)
        job = harness.call_builder(fn, b, s if seq_dim is not None else seq_len)
        harness.check_dims(job.inputs, batch_dim, seq_dim)  # InputDimError: no fallback retries it
        return job

    def make_fake_job(b, s, fm):
        try:
            with fm:
                job = make_job(b, s)
            note = None
        except InputDimError:
            raise
        except Exception as e:  # an initializer that reads values, a real checkpoint loaded, ...
            job = make_job(b, s)
            note = ("the builder failed under fake tensors (%s: %s); it ran for real and its tensors were "
                    "converted to fake ones" % (type(e).__name__, (str(e).splitlines() or [""])[0][:200]))
        return harness.to_fake(job, fm), note

    doc = build_trace(make_job, batch, seq_len, optimizer, device, foreach, batch_dim, seq_dim,
                      name=name or spec, source=spec, make_fake_job=make_fake_job if fake else None)
    write_json(doc, path)
    return doc
