"""Gradient alignment: k accumulated micro-steps (loss/k each) against one full-batch step.

Accumulation reproduces the full-batch gradient only when the loss is a mean over independent samples.
A model with BatchNorm in training mode cannot align: its statistics (and so every gradient) depend on
which samples share a micro-batch. Dropout draws different masks in the two runs, so dropout is switched
off (p = 0) for the comparison and this is reported.
"""

import copy

import torch

from . import compat, harness
from .workload import validate

# relative tolerance: max |g_accum - g_full| / max |g_full|, per parameter
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _batchnorms(model):
    return [n or type(m).__name__ for n, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]


def _disable_dropout(model):
    names = []
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            m.p = 0.0
            names.append(n)
        elif isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0:
            m.dropout = 0.0
            names.append(n)
        elif isinstance(m, torch.nn.RNNBase) and m.dropout > 0:
            m.dropout = 0.0
            names.append(n)
    return names


def _grads(model):
    return {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def check_alignment(job, k, batch_dim=0, dtype=None, device="cpu", tolerance=None):
    """Compares k accumulated micro-steps with the full batch for a harness.Job (or a builder spec
    through check_workload). Returns a report dict."""
    if k < 2:
        raise ValueError("memplan_torch: alignment needs an accumulation k >= 2, got %d" % k)
    model = job.model
    model.train()
    if dtype is not None:
        model.to(dtype)
    dtype = next(model.parameters()).dtype
    tol = tolerance if tolerance is not None else TOLERANCE.get(dtype, 1e-4)
    batch = harness.batch_size_of(job.inputs, batch_dim)
    if batch % k:
        raise ValueError("memplan_torch: batch %d is not divisible by accumulation %d" % (batch, k))
    harness.to_device(job, device, dtype)
    notes = []
    reasons = []
    dropped = _disable_dropout(model)
    if dropped:
        notes.append("dropout set to 0 for the comparison in: %s" % ", ".join(dropped[:8]))
    bns = _batchnorms(model)
    if bns:
        reasons.append("the model has BatchNorm in training mode (%s%s): its batch statistics depend on the "
                       "micro-batch, so accumulating %d micro-batches of %d is not the same computation as one "
                       "batch of %d" % (", ".join(bns[:4]), " ..." if len(bns) > 4 else "", k, batch // k, batch))

    full = copy.deepcopy(model)
    acc = copy.deepcopy(model)
    # full batch
    full_job = harness.Job(full, job.inputs, job.loss_fn, job.targets)
    full_job.loss(full_job.forward()).backward()
    g_full = _grads(full)
    # accumulated
    acc_job = harness.Job(acc, job.inputs, job.loss_fn, job.targets)
    mi = harness.chunk(job.inputs, batch_dim, k)
    mt = harness.chunk(job.targets, batch_dim, k) if job.targets is not None else [None] * k
    for i in range(k):
        (acc_job.loss(acc_job.forward(mi[i]), mt[i]) / k).backward()
    g_acc = _grads(acc)

    worst = (0.0, 0.0, None)  # rel, abs, name
    ratios = []
    for n, gf in g_full.items():
        ga = g_acc[n]
        if gf is None or ga is None:
            if (gf is None) != (ga is None):
                reasons.append("parameter %s gets a gradient in only one of the runs" % n)
            continue
        diff = (ga.double() - gf.double()).abs().max().item()
        scale = gf.double().abs().max().item()
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        if scale > 0:
            ratios.append(ga.double().abs().max().item() / scale)
        if rel > worst[0] or worst[2] is None:
            worst = (rel, diff, n)
    aligned = worst[0] <= tol and not reasons
    if not aligned and not bns and ratios and all(abs(r * k - 1) < 1e-3 for r in ratios):
        reasons.append("accumulated gradients are 1/%d of the full-batch ones: the loss sums over the batch; "
                       "with loss/k accumulation it must be a mean over samples" % k)
    elif not aligned and not bns and not reasons:
        reasons.append("gradients differ by %.3g (relative) in %s, above the tolerance %.1g: the loss or the model "
                       "mixes samples of a batch" % (worst[0], worst[2], tol))
    return {
        "aligned": aligned,
        "accumulation": k,
        "micro_batch": batch // k,
        "effective_batch": batch,
        "dtype": compat.dtype_name(dtype),
        "device": str(device),
        "max_abs_diff": worst[1],
        "max_rel_diff": worst[0],
        "worst_parameter": worst[2],
        "tolerance_rel": tol,
        "tolerance_definition": "max |g_accumulated - g_full| / max |g_full| per parameter",
        "reasons": reasons,
        "notes": notes,
    }


def check_workload(w, k=None, tolerance=None):
    """Alignment for a workload (dict or validated) with k = strategy.accumulation unless given."""
    w = validate(dict(w))
    k = k or w["strategy"]["accumulation"]
    if k < 2:
        raise ValueError("memplan_torch: the workload has strategy.accumulation 1; give k >= 2 (--k)")
    torch.manual_seed(w["seed"])
    builder = harness.load_builder(w["model"])
    job = harness.call_builder(builder, w["batch"], w["seq_len"], **w["model_args"])
    device = "cuda" if w["device"] == "cuda" else "cpu"
    rep = check_alignment(job, k, batch_dim=w["batch_dim"], dtype=compat.parse_dtype(w["dtype"]),
                          device=device, tolerance=tolerance)
    rep["name"] = w["name"]
    return rep


def format_report(rep):
    lines = ["%s: %s" % (rep.get("name", "model"), "ALIGNED" if rep["aligned"] else "NOT ALIGNED"),
             "  effective batch %d = %d micro-batches of %d" % (rep["effective_batch"], rep["accumulation"],
                                                                rep["micro_batch"]),
             "  max abs diff %.3g, max relative diff %.3g (tolerance %.1g, %s) worst parameter %s" % (
                 rep["max_abs_diff"], rep["max_rel_diff"], rep["tolerance_rel"], rep["dtype"],
                 rep["worst_parameter"])]
    for r in rep["reasons"]:
        lines.append("  cannot align: " + r)
    for n in rep["notes"]:
        lines.append("  note: " + n)
    return "\n".join(lines)
