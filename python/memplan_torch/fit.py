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
    different sizes compare even when their first steps created different numbers of storages. Returns
    (events, {raw id: canonical id})."""
    ids = {}
    for s in sorted(initial):
        ids[s] = len(ids)
    out = []
    for e in events:
        for s in e["alloc"]:
            ids.setdefault(s, len(ids))
        c = dict(e)
        for f in ("alloc", "free", "saved"):
            c[f] = [ids.setdefault(s, len(ids)) for s in e[f]]
        out.append(c)
    return out, ids


def describe(ev):
    return "%s (phase %s, module %r)" % (ev["op"], ev["phase"], ev["module"] or "<root>")


def align(a, b, what):
    """Checks two canonical event lists match op for op; raises ExportError naming the first difference,
    with the op of each trace and its module."""
    n = min(len(a), len(b))
    for i in range(n):
        x, y = a[i], b[i]
        for field in ("op", "phase", "module"):
            if x[field] != y[field]:
                raise ExportError(
                    "memplan_torch: traces at %s do not align at op %d: %s vs %s. The model runs different "
                    "ops at different sizes (data- or shape-dependent control flow); it cannot be exported "
                    "with a size model. Make the control flow independent of the batch/sequence size."
                    % (what, i, describe(x), describe(y)))
        for field in ("alloc", "free", "saved"):
            if sorted(x[field]) != sorted(y[field]):
                raise ExportError(
                    "memplan_torch: traces at %s do not align at op %d %s: its %s storages differ "
                    "(%s vs %s). Storage lifetimes depend on the size; the model cannot be exported with a "
                    "size model." % (what, i, describe(x), field, x[field][:8], y[field][:8]))
    if len(a) != len(b):
        longer = a if len(a) > len(b) else b
        raise ExportError(
            "memplan_torch: traces at %s do not align: %d vs %d ops; the first extra op is %d %s. The model "
            "runs a size-dependent number of ops (a loop over the batch or sequence?)."
            % (what, len(a), len(b), n, describe(longer[n])))


def fit_line(points, label):
    """points: [(x, y)] with 2 points -> (c0, c1) integers, exact."""
    (x1, y1), (x2, y2) = points
    c1 = Fraction(y2 - y1, x2 - x1)
    c0 = y1 - c1 * x1
    if c1.denominator != 1 or c0.denominator != 1:
        raise ExportError("memplan_torch: %s is not an integer-linear function of the batch: %d bytes at %d, "
                          "%d bytes at %d" % (label, y1, x1, y2, x2))
    return int(c0), int(c1)


def fit_quadratic(points, label):
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
                              "(degree <= 2): sizes %s" % (label, [(int(x), int(y)) for x, y in points]))
    return int(a0), int(a1), int(a2)


def size_models(nbytes, batches, seqs, sids, label_of):
    """nbytes(key, sid) -> bytes of storage sid (a structure-trace id) in the trace at key = (batch, seq).
    Returns per sid the size coefficients."""
    out = {}
    for sid in sids:
        label = label_of(sid)
        if seqs is None:
            pts = [(b, nbytes((b, None), sid)) for b in batches]
            c0, c1 = fit_line(pts, label)
            out[sid] = {"bytes_const": c0, "bytes_per_batch": c1}
            continue
        consts, slopes = [], []
        for s in seqs:
            pts = [(b, nbytes((b, s), sid)) for b in batches]
            c0, c1 = fit_line(pts, "%s at seq %d" % (label, s))
            consts.append((s, c0))
            slopes.append((s, c1))
        a0, a1, a2 = fit_quadratic(consts, label)
        b0, b1, b2 = fit_quadratic(slopes, label + " (per batch)")
        out[sid] = {"bytes_const": a0, "bytes_per_batch": b0, "bytes_per_seq": a1, "bytes_per_seq2": a2,
                    "bytes_per_batch_seq": b1, "bytes_per_batch_seq2": b2}
    return out


def bytes_at(model, batch, seq=None):
    """A size model (the dict size_models returns for one storage) at batch (and seq)."""
    n = model["bytes_const"] + model["bytes_per_batch"] * batch
    if seq is not None and "bytes_per_seq" in model:
        n += (model["bytes_per_seq"] * seq + model["bytes_per_seq2"] * seq * seq
              + model["bytes_per_batch_seq"] * batch * seq + model["bytes_per_batch_seq2"] * batch * seq * seq)
    return n
