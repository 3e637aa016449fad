"""Validation suite: each case is exported (trace) at a small batch and measured at a larger one.

    python3 -m memplan_torch suite --out DIR [--device cpu|cuda|auto]

writes DIR/<trace>.trace.json, DIR/workloads/<case>.{yaml,json}, DIR/measured.json and DIR/summary.txt.
On CPU the process re-executes itself under the LD_PRELOAD tracker (see tracker.py).
"""

import json
import os
import time

from . import compat
from .export import export_builder, write_json
from .measure import document, measure_workload, resolve_device
from .replay import replay
from .workload import SCHEMA as WORKLOAD_SCHEMA
from .workload import validate

M = "memplan_torch.models:"

# trace: name of the trace file the case is checked against (traces are taken without strategies)
TRACES = {
    "resnet18": dict(model=M + "resnet18", optimizer="sgd-momentum", batch=2),
    "mobilenet_v2": dict(model=M + "mobilenet_v2", optimizer="adamw", batch=2),
    "vit_tiny": dict(model=M + "vit_tiny", optimizer="adamw", batch=2),
    "lm": dict(model=M + "transformer_lm", optimizer="adamw", batch=2, seq_len=64, seq_dim=1),
    "lm_sgd": dict(model=M + "transformer_lm", optimizer="sgd", batch=2, seq_len=64),
    "gru": dict(model=M + "gru", optimizer="sgd", batch=2, seq_len=32),
    # models that checkpoint their own layers (Hugging Face's gradient_checkpointing_enable()): the trace
    # records the recompute inside backward, as it runs
    "lm_selfckpt": dict(model=M + "transformer_lm_ckpt", optimizer="adamw", batch=2, seq_len=64),
    "lm_selfckpt_reentrant": dict(model=M + "transformer_lm_ckpt_reentrant", optimizer="adamw", batch=2,
                                  seq_len=64),
    # exported at batch 1 (issue 16): traced at 2 and 4, predicted at 1, 2 and 8. The small models run in CI;
    # torchvision's ViT-B/16 and Swin-T themselves (heavy: minutes and GiBs on two cores) only when named
    # (--cases, scripts/validate.sh --heavy)
    "vit_b16_small": dict(model=M + "vit_b16_small", optimizer="adamw", batch=1),
    "swin_small": dict(model=M + "swin_small", optimizer="adamw", batch=1),
    "vit_b_16": dict(model=M + "vit_b_16", optimizer="adamw", batch=1, heavy=True),
    "swin_t": dict(model=M + "swin_t", optimizer="adamw", batch=1, heavy=True),
    # a transformers Llama (hf.py: the catalog's llama-3.2-1b scaled down) after gradient_checkpointing_enable(),
    # non-reentrant (transformers 5.x's default) and reentrant; needs transformers (PyTorch 2.x venv)
    "hf_llama_gc": dict(model="memplan_torch.hf:llama_gc", optimizer="adamw", batch=2, seq_len=64,
                        needs="transformers"),
    "hf_llama_gc_reentrant": dict(model="memplan_torch.hf:llama_gc_reentrant", optimizer="adamw", batch=2,
                                  seq_len=64, needs="transformers"),
}

CASES = [
    dict(name="resnet18", trace="resnet18", batch=16),
    dict(name="mobilenet_v2", trace="mobilenet_v2", batch=16),
    dict(name="vit_tiny", trace="vit_tiny", batch=32),
    dict(name="lm", trace="lm", batch=16),
    dict(name="lm_ckpt", trace="lm", batch=16, strategy={"checkpoint": "blocks", "checkpoint_blocks": "layers"}),
    dict(name="lm_accum4", trace="lm", batch=16, strategy={"accumulation": 4}),
    dict(name="lm_sgd_ckpt_accum2", trace="lm_sgd", batch=16,
         strategy={"checkpoint": "blocks", "checkpoint_blocks": "layers", "accumulation": 2}),
    dict(name="gru", trace="gru", batch=32),
    dict(name="lm_selfckpt", trace="lm_selfckpt", batch=16),
    dict(name="lm_selfckpt_reentrant", trace="lm_selfckpt_reentrant", batch=16),
    dict(name="hf_llama_gc", trace="hf_llama_gc", batch=16),
    dict(name="hf_llama_gc_reentrant", trace="hf_llama_gc_reentrant", batch=16),
] + [dict(name="%s_b%d" % (t, b), trace=t, batch=b) for t in ("vit_b16_small", "swin_small") for b in (1, 2, 8)] \
  + [dict(name="%s_b%d" % (t, b), trace=t, batch=b, heavy=True) for t in ("vit_b_16", "swin_t") for b in (1, 2, 8)]

HEAVY = [c["name"] for c in CASES if c.get("heavy")]


def _foreach(device):
    # the optimizer implementation must be the same in the trace and the measurement: torch 2.x defaults to
    # foreach on CUDA and to the per-tensor loop elsewhere, so pin it
    return True if device == "cuda" else False


def workload_for(case, device, iters=2, warmup=1):
    t = TRACES[case["trace"]]
    w = {"foreach": _foreach(device), "schema": WORKLOAD_SCHEMA, "name": case["name"], "model": t["model"], "dtype": "float32",
         "batch": case["batch"], "device": device, "warmup": warmup, "iters": iters, "seed": 0,
         "optimizer": t["optimizer"]}
    if t.get("seq_len"):
        w["seq_len"] = t["seq_len"]
    if case.get("strategy"):
        w["strategy"] = dict(case["strategy"])
    return validate(w, "suite case %s" % case["name"])


def _write_workload(w, d):
    os.makedirs(d, exist_ok=True)
    src = {k: v for k, v in w.items() if v is not None and v != {}}
    try:
        import yaml
        p = os.path.join(d, w["name"] + ".yaml")
        with open(p, "w") as f:
            yaml.safe_dump(src, f, sort_keys=False)
    except ImportError:
        p = os.path.join(d, w["name"] + ".json")
        with open(p, "w") as f:
            json.dump(src, f, indent=1)
    return p


def _importable(module):
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _mib(n):
    return "%.2f" % (n / 2 ** 20)


FAKE_TOLERANCE = 0.01  # issue 10: fake-tensor traces predict within 1% of the real-execution traces


def run(out, device="auto", cases=None, iters=2, warmup=1, log=print):
    device = resolve_device(device)
    os.makedirs(out, exist_ok=True)
    if cases is not None:
        unknown = [n for n in cases if n not in {c["name"] for c in CASES}]
        if unknown:
            raise ValueError("memplan_torch: unknown suite case %s (--cases; the cases are %s)"
                             % (", ".join(unknown), ", ".join(c["name"] for c in CASES)))
    selected = [c for c in CASES if (c["name"] in cases if cases is not None else not c.get("heavy"))]
    missing = [c["name"] for c in selected if not _importable(TRACES[c["trace"]].get("needs"))]
    if missing:
        if cases is not None:
            raise ValueError("memplan_torch: suite case %s needs the %s package (python/requirements-torch2.txt)"
                             % (", ".join(missing), ", ".join(sorted({TRACES[c["trace"]]["needs"] for c in selected
                                                                     if c["name"] in missing}))))
        log("skipping %s: %s not installed" % (", ".join(missing), ", ".join(
            sorted({TRACES[c["trace"]]["needs"] for c in selected if c["name"] in missing}))))
        selected = [c for c in selected if c["name"] not in missing]
    t0 = time.time()
    # On CPU, trace on CPU: some composite ops decompose differently on meta than on CPU (nn.GRU: the
    # meta trace runs per-step addmm where CPU precomputes the input projection), so a meta trace would
    # not be the program that is measured. On CUDA, meta first (its non-CPU paths are closer to CUDA's).
    trace_device = "cpu" if device == "cpu" else "auto"
    traces = {}
    # PyTorch 2.x: every trace is also exported under fake tensors (nothing computed), and each case checks that
    # the fake trace predicts what the real one predicts, per phase, within FAKE_TOLERANCE (issue 10)
    fake_check = device == "cpu" and compat.fake_tensors_available()
    fakes = {}
    for name in sorted({c["trace"] for c in selected}):
        t = TRACES[name]
        ts = time.time()
        path = os.path.join(out, name + ".trace.json")
        doc = export_builder(t["model"], path, batch=t["batch"], seq_len=t.get("seq_len"),
                             optimizer=t["optimizer"], seq_dim=t.get("seq_dim"), name=name,
                             device=trace_device, foreach=_foreach(device))
        traces[name] = doc
        log("trace %-14s %5d events on %-4s %6.1fs" % (name, len(doc["events"]), doc["trace_device"],
                                                          time.time() - ts))
        if fake_check:
            ts = time.time()
            fakes[name] = export_builder(t["model"], os.path.join(out, name + ".fake.trace.json"), fake=True,
                                         batch=t["batch"], seq_len=t.get("seq_len"), optimizer=t["optimizer"],
                                         seq_dim=t.get("seq_dim"), name=name, foreach=_foreach(device))
            log("trace %-14s %5d events fake     %6.1fs" % (name, len(fakes[name]["events"]), time.time() - ts))
    results = []
    fake_failures = []
    for c in selected:
        ts = time.time()
        w = workload_for(c, device, iters=iters, warmup=warmup)
        _write_workload(w, os.path.join(out, "workloads"))
        case = measure_workload(w)
        doc = traces[c["trace"]]
        case["trace"] = c["trace"] + ".trace.json"
        case["trace_batch"] = doc["trace_batch"]
        if not c.get("strategy"):
            thr = case["memory"].get("threshold_bytes", 0)
            r = replay(doc, case["micro_batch"], case["seq_len"] if doc.get("seq_dim") is not None else None,
                       min_bytes=thr)
            rs = replay(doc, case["micro_batch"], case["seq_len"] if doc.get("seq_dim") is not None else None,
                        min_bytes=thr, scratch=True)
            rf = replay(doc, case["micro_batch"], case["seq_len"] if doc.get("seq_dim") is not None else None,
                        first_step=True, min_bytes=thr)
            case["trace_replay"] = {
                "note": "memplan_torch.replay of the trace at the measured batch, storages >= the "
                        "tracker threshold; op outputs only (no in-kernel buffers)",
                "phases": r["phases"], "peak_bytes": r["peak_bytes"], "baseline_bytes": r["baseline_bytes"],
                "first_step_phases": rf["phases"],
                "error_vs_measured": {p: round(r["phases"].get(p, 0) / case["phases"][p] - 1, 4)
                                      for p in case["phases"] if case["phases"][p]},
            }
            if doc.get("scratch") == "measured":
                case["trace_replay"]["phases_with_scratch"] = rs["phases"]
                case["trace_replay"]["error_with_scratch"] = {
                    p: round(rs["phases"].get(p, 0) / case["phases"][p] - 1, 4)
                    for p in case["phases"] if case["phases"][p]}
            if "all_phases" in case:
                case["trace_replay"]["error_vs_all"] = {
                    p: round(r["phases"].get(p, 0) / case["all_phases"][p] - 1, 4)
                    for p in case["all_phases"] if case["all_phases"][p] > 0}
        if fake_check:
            seq = case["seq_len"] if doc.get("seq_dim") is not None else None
            thr = case["memory"].get("threshold_bytes", 0)
            rr = replay(doc, case["micro_batch"], seq, min_bytes=thr)["phases"]
            fr = replay(fakes[c["trace"]], case["micro_batch"], seq, min_bytes=thr)["phases"]
            err = {p: round(fr.get(p, 0) / rr[p] - 1, 5) for p in rr if rr[p]}
            case["fake_trace"] = {
                "note": "memplan_torch.replay of the fake-tensor trace (%s) against the real one at the measured "
                        "batch, per phase (strategies not applied)" % (c["trace"] + ".fake.trace.json"),
                "phases": fr, "error_vs_real_trace": err}
            bad = {p: e for p, e in err.items() if abs(e) > FAKE_TOLERANCE}
            if bad:
                fake_failures.append("%s (%s)" % (c["name"], ", ".join("%s %+.2f%%" % (p, 100 * e)
                                                                      for p, e in sorted(bad.items()))))
        case["wall_s"] = round(time.time() - ts, 2)
        results.append(case)
        ph = case["phases"]
        extra = ""
        if "fake_trace" in case:
            extra = " fake-vs-real " + " ".join("%+.2f%%" % (100 * v) for v in case["fake_trace"]["error_vs_real_trace"].values())
        if "trace_replay" in case:
            extra += " replay err " + " ".join("%+.1f%%" % (100 * v) for v in case["trace_replay"]["error_vs_measured"].values())
            if "error_with_scratch" in case["trace_replay"]:
                extra += " (+scratch " + " ".join("%+.1f%%" % (100 * v) for v in case["trace_replay"]["error_with_scratch"].values()) + ")"
            if "error_vs_all" in case["trace_replay"]:
                extra += " (all " + " ".join("%+.1f%%" % (100 * v) for v in case["trace_replay"]["error_vs_all"].values()) + ")"
        log("measure %-20s fwd %8s bwd %8s opt %8s MiB  start %8s  %6.3fs/step %5.1fs%s" % (
            c["name"], _mib(ph["forward"]), _mib(ph["backward"]), _mib(ph["optimizer"]),
            _mib(case["baseline_bytes"]), case["step_time_s"], case["wall_s"], extra))
    doc = document(results)
    doc["suite"] = {"device": device, "trace_device": trace_device, "wall_s": round(time.time() - t0, 2),
                    "fake_check": fake_check,
                    "checkpoint_mode": compat.checkpoint_mode()}
    write_json(doc, os.path.join(out, "measured.json"))
    lines = ["case                  device  batch  forward_MiB  backward_MiB  optimizer_MiB  start_MiB  "
             "first_opt_MiB  step_s"]
    for c in results:
        lines.append("%-21s %-7s %5d  %11s  %12s  %13s  %9s  %13s  %6.3f" % (
            c["name"], c["device"], c["batch"], _mib(c["phases"]["forward"]), _mib(c["phases"]["backward"]),
            _mib(c["phases"]["optimizer"]), _mib(c["baseline_bytes"]),
            _mib(c["first_step"]["phases"]["optimizer"]), c["step_time_s"]))
    lines.append("total wall %.1fs, torch %s, checkpointing %s" % (time.time() - t0, compat.TORCH_VERSION,
                                                                   compat.checkpoint_mode()))
    if fake_check:
        lines.append("fake-tensor traces vs real-execution traces: %s" % (
            "within %g%% on every case" % (100 * FAKE_TOLERANCE) if not fake_failures else
            "beyond %g%% on %s" % (100 * FAKE_TOLERANCE, "; ".join(fake_failures))))
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log("\n".join(lines))
    if fake_failures:
        raise ValueError("memplan_torch: the fake-tensor traces predict beyond %g%% of the real-execution traces on "
                         "%s (the suite's files are in %s)" % (100 * FAKE_TOLERANCE, "; ".join(fake_failures), out))
    return doc
