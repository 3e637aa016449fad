"""The exporter's size model: which sizes to trace at, how the traces are matched op by op, and the exact
integer fit of every storage's size in the batch (and the sequence).

Sizes of 1 are never traced on a dimension that is fitted. PyTorch takes size-1 fast paths: with a batch
(or sequence) of 1 a reshape of a permuted tensor is a view (`aten.view`, `aten._reshape_alias`) where at
any larger size it is a copy (`aten.clone` + `aten._unsafe_view`), `.contiguous()` of such a tensor is no
op at all, and an `expand` of a size-1 dimension followed by a reshape is a view. torchvision's ViT-B/16
and Swin-T at batch 1 are examples (issue 16). The size model is a property of the program the model runs
at sizes of 2 and more; asked for 1, the exporter traces at 2 and 4 (sequence: 2, 3 and 4), fits, and
evaluates the fit at 1. The document's `trace_batch`/`trace_seq` are the sizes asked for (its `bytes`);
`traced_at` names the traced point whose ops, shapes and scratch the document records.
"""

from fractions import Fraction

from .trace import ExportError

SEQ_TERMS = ("bytes_per_seq", "bytes_per_seq2", "bytes_per_batch_seq", "bytes_per_batch_seq2")


def fit_points(batch, seq_len=None, seq_dim=None):
    """The sizes to trace at for a document at `batch` (and `seq_len`, fitted when seq_dim is given).

    Returns (batches, seqs or None, (structure batch, structure seq or None)): the structure point is the
    traced point whose events the document records, the requested one unless a size of 1 was asked for.
    Batch: b and 2b, or 2 and 4 for b = 1. Sequence: s, s-d, s-2d with d = max(1, s // 4) for s >= 4,
    else 4, 3 and 2 (never 1)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ExportError("memplan_torch: the batch (--batch) must be a whole number of at least 1, got %r"
                          % (batch,))
    sb = batch if batch >= 2 else 2
    batches = [sb, 2 * sb]
    if seq_dim is None:
        return batches, None, (sb, None)
    if seq_len is None:
        raise ExportError("memplan_torch: --seq-dim needs --seq-len (the sequence length to trace at)")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ExportError("memplan_torch: the sequence length (--seq-len) must be a whole number of at least 1, "
                          "got %r" % (seq_len,))
    if seq_len >= 4:
        d = max(1, seq_len // 4)
        seqs = [seq_len, seq_len - d, seq_len - 2 * d]
    else:
        seqs = [4, 3, 2]
    ss = seq_len if seq_len in seqs else 2
    # the structure point first: the traces at the other points are matched against it
    seqs = [ss] + [s for s in seqs if s != ss]
    return batches, seqs, (sb, ss)


def canonical(events, initial):
    """Events with storage ids renumbered by first appearance (initial storages first), so that traces at
    different sizes compare even when their first steps created different numbers of storages. Each event's
    "inputs" and output storages are renumbered too ("inputs_c", "outputs_c"; None for a storage not seen yet).
    Returns (events, {raw id: canonical id})."""
    ids = {}
    for s in sorted(initial):
        ids[s] = len(ids)
    out = []
    for e in events:
        c = dict(e)
        c["inputs_c"] = tuple(ids.get(s) for s in e.get("inputs", ()))
        for s in e["alloc"]:
            ids.setdefault(s, len(ids))
        for f in ("alloc", "free", "saved"):  # tuples, as trace._seal says why
            c[f] = tuple(ids.setdefault(s, len(ids)) for s in e[f])
        c["outputs_c"] = tuple(dict(o, storage=ids.get(o["storage"])) for o in e.get("outputs", ()))
        out.append(c)
    return out, ids


def describe(ev):
    return "%s (phase %s, module %r)" % (ev["op"], ev["phase"], ev["module"] or "<root>")


# Ops that may stand for one another between two traces of the same program at different sizes: PyTorch
# chooses between a view and a copy of the same elements by the strides it gets (a reshape of a permuted tensor
# is a view when the permuted dimensions have size 1, else clone + _unsafe_view; .contiguous() is nothing or a
# clone; an expand followed by a reshape is a view or a copy; a repeat of a size-1 dimension where expand
# would do). "view": returns an alias of its input; "copy": allocates the same elements anew.
TOLERATED = {
    "aten.view.default": "view",
    "aten._reshape_alias.default": "view",
    "aten._unsafe_view.default": "view",
    "aten.reshape.default": "view",
    "aten.expand.default": "view",
    "aten.alias.default": "view",
    "aten.as_strided.default": "view",
    "aten.squeeze.dim": "view",
    "aten.squeeze.dims": "view",
    "aten.squeeze.default": "view",
    "aten.unsqueeze.default": "view",
    "aten.clone.default": "copy",
    "aten.contiguous.default": "copy",
    "aten.copy.default": "copy",
    "aten.copy_.default": "copy",
    "aten.repeat.default": "copy",
    "aten.expand_copy.default": "copy",
    "aten.view_copy.default": "copy",
    "aten._reshape_copy.default": "copy",
}


class Alignment:
    """The result of align: pairs [(i, j)] of matched events; smap {storage of a: storage of b} (canonical ids);
    regions [((i0, i1), (j0, j1))] where the traces differ only in aliasing (a[i0:i1] stands for b[j0:j1]);
    only_a / only_b {storage: (how, what)}: storages a copy allocates in one trace where the other views, with
    what to size them by in the other trace: ("shape", (shape, dtype)) of the view there, or ("storage", sid)
    of the storage the copy reads (its image in the other trace; an upper bound of the bytes copied)."""

    def __init__(self):
        self.pairs, self.smap, self.regions, self.only_a, self.only_b = [], {}, [], {}, {}

    def event_map(self):
        return dict(self.pairs)


def _run_end(evs, i):
    """The end of the run of tolerated ops from i in one phase and module."""
    if i >= len(evs) or evs[i]["op"] not in TOLERATED:
        return i
    key = (evs[i]["phase"], evs[i]["module"])
    k = i
    while k < len(evs) and evs[k]["op"] in TOLERATED and (evs[k]["phase"], evs[k]["module"]) == key:
        k += 1
    return k


def _same(x, y):
    return x["op"] == y["op"] and x["phase"] == y["phase"] and x["module"] == y["module"]


def _sized_by(own, other, other_map):
    """For each storage a copy allocates in `own` (a region of one trace), what gives its bytes in the other
    trace, whose region `other` views: the last view output of the same dtype there, else the copy's input."""
    out = {}
    for e in own:
        for s in e["alloc"]:
            o = next((o for o in e.get("outputs_c", ()) if o["storage"] == s), None)
            dt = o["dtype"] if o else None
            seen = [p for x in other for p in x.get("outputs_c", ()) if p["dtype"] == dt]
            if seen:
                out[s] = ("shape", (list(seen[-1]["shape"]), dt))
                continue
            src = [other_map[c] for c in e.get("inputs_c", ()) if c is not None and c in other_map]
            out[s] = ("storage", src[0]) if src else None
    return out


def align(a, b, what):
    """Matches two canonical event lists op for op, allowing runs of aliasing ops (TOLERATED) where one trace
    views and the other copies the same elements. Returns an Alignment; raises ExportError naming the first
    real difference, with the op of each trace and its module.

    Matching is two-pointer: equal ops (op, phase, module) pair; at a difference, the run of tolerated ops of
    one phase and module from each side (either may be empty) is skipped when the ops after them match, or
    both traces end there. Matched events must allocate as many storages (paired in order); their frees and
    saves must agree through that pairing, except for the storages a skipped run touches (its allocations and
    inputs), whose lifetimes the view or the copy changes."""
    al = Alignment()
    inv = {}
    tainted_a, tainted_b = set(), set()
    i = j = 0
    n, m = len(a), len(b)
    while i < n or j < m:
        if i < n and j < m and _same(a[i], b[j]):
            x, y = a[i], b[j]
            if len(x["alloc"]) != len(y["alloc"]):
                raise ExportError(
                    "memplan_torch: traces at %s do not align at op %d %s: its alloc storages differ (%d vs %d "
                    "storages). Storage lifetimes depend on the size; the model cannot be exported with a size "
                    "model." % (what, i, describe(x), len(x["alloc"]), len(y["alloc"])))
            for s, t in zip(x["alloc"], y["alloc"]):
                al.smap[s] = t
                inv[t] = s
            for field in ("free", "saved"):
                xs = sorted(al.smap.get(s, s) for s in x[field] if s not in tainted_a
                            and al.smap.get(s, s) not in tainted_b)
                ys = sorted(t for t in y[field] if t not in tainted_b and inv.get(t, t) not in tainted_a)
                if xs != ys:
                    raise ExportError(
                        "memplan_torch: traces at %s do not align at op %d %s: its %s storages differ "
                        "(%s vs %s). Storage lifetimes depend on the size; the model cannot be exported with a "
                        "size model." % (what, i, describe(x), field, x[field][:8], y[field][:8]))
            al.pairs.append((i, j))
            i += 1
            j += 1
            continue
        ri, rj = _run_end(a, i), _run_end(b, j)
        skip = None
        for ci, cj in ((ri, rj), (ri, j), (i, rj)):
            if (ci, cj) == (i, j):
                continue
            if (ci == n and cj == m) or (ci < n and cj < m and _same(a[ci], b[cj])):
                skip = (ci, cj)
                break
        if skip is None:
            if i < n and j < m:
                raise ExportError(
                    "memplan_torch: traces at %s do not align at op %d: %s vs %s. The model runs different "
                    "ops at different sizes (data- or shape-dependent control flow); it cannot be exported "
                    "with a size model. Make the control flow independent of the batch/sequence size."
                    % (what, i, describe(a[i]), describe(b[j])))
            longer, k = (a, i) if i < n else (b, j)
            raise ExportError(
                "memplan_torch: traces at %s do not align: %d vs %d ops; the first extra op is %d %s. The model "
                "runs a size-dependent number of ops (a loop over the batch or sequence?)."
                % (what, n, m, k, describe(longer[k])))
        ra, rb = a[i:skip[0]], b[j:skip[1]]
        al.regions.append(((i, skip[0]), (j, skip[1])))
        al.only_a.update(_sized_by(ra, rb, al.smap))
        al.only_b.update(_sized_by(rb, ra, inv))
        for e in ra:
            tainted_a.update(e["alloc"])
            tainted_a.update(c for c in e.get("inputs_c", ()) if c is not None)
        for e in rb:
            tainted_b.update(e["alloc"])
            tainted_b.update(c for c in e.get("inputs_c", ()) if c is not None)
        tainted_b.update(al.smap[s] for s in list(tainted_a) if s in al.smap)
        tainted_a.update(inv[t] for t in list(tainted_b) if t in inv)
        i, j = skip
    return al


def fit_line(points, label, unit="bytes"):
    """points: [(x, y)] with 2 points -> (c0, c1) integers, exact."""
    (x1, y1), (x2, y2) = points
    c1 = Fraction(y2 - y1, x2 - x1)
    c0 = y1 - c1 * x1
    if c1.denominator != 1 or c0.denominator != 1:
        raise ExportError("memplan_torch: %s is not an integer-linear function of the batch: %d %s at %d, "
                          "%d %s at %d" % (label, y1, unit, x1, y2, unit, x2))
    return int(c0), int(c1)


def fit_quadratic(points, label, unit="sizes"):
    """points: 3 (x, y) -> (a0, a1, a2) integers with y = a0 + a1 x + a2 x^2, exact."""
    (x1, y1), (x2, y2), (x3, y3) = [(Fraction(x), Fraction(y)) for x, y in points]
    # Newton divided differences
    d1 = (y2 - y1) / (x2 - x1)
    d2 = ((y3 - y2) / (x3 - x2) - d1) / (x3 - x1)
    a2 = d2
    a1 = d1 - d2 * (x1 + x2)
    a0 = y1 - a1 * x1 - a2 * x1 * x1
    for c in (a0, a1, a2):
        if c.denominator != 1:
            raise ExportError("memplan_torch: %s is not an integer polynomial of the sequence length "
                              "(degree <= 2): %s %s" % (label, unit, [(int(x), int(y)) for x, y in points]))
    return int(a0), int(a1), int(a2)


def size_models(nbytes, batches, seqs, sids, label_of, quantity="bytes"):
    """nbytes(key, sid) -> bytes of storage sid (a structure-trace id) in the trace at key = (batch, seq).
    Returns per sid the size coefficients. With quantity "flops", the same exact fit of an event's FLOPs (sid
    an event index), its coefficients named flops_const, flops_per_batch, ..."""
    unit, units_ = ("bytes", "sizes") if quantity == "bytes" else (quantity, quantity)
    out = {}
    for sid in sids:
        label = label_of(sid)
        if seqs is None:
            pts = [(b, nbytes((b, None), sid)) for b in batches]
            c0, c1 = fit_line(pts, label, unit)
            out[sid] = {quantity + "_const": c0, quantity + "_per_batch": c1}
            continue
        consts, slopes = [], []
        for s in seqs:
            pts = [(b, nbytes((b, s), sid)) for b in batches]
            c0, c1 = fit_line(pts, "%s at seq %d" % (label, s), unit)
            consts.append((s, c0))
            slopes.append((s, c1))
        a0, a1, a2 = fit_quadratic(consts, label, units_)
        b0, b1, b2 = fit_quadratic(slopes, label + " (per batch)", units_)
        q = quantity
        out[sid] = {q + "_const": a0, q + "_per_batch": b0, q + "_per_seq": a1, q + "_per_seq2": a2,
                    q + "_per_batch_seq": b1, q + "_per_batch_seq2": b2}
    return out


def bytes_at(model, batch, seq=None, quantity="bytes"):
    """A size model (the dict size_models returns for one storage) at batch (and seq)."""
    q = quantity
    n = model[q + "_const"] + model[q + "_per_batch"] * batch
    if seq is not None and q + "_per_seq" in model:
        n += (model[q + "_per_seq"] * seq + model[q + "_per_seq2"] * seq * seq
              + model[q + "_per_batch_seq"] * batch * seq + model[q + "_per_batch_seq2"] * batch * seq * seq)
    return n
