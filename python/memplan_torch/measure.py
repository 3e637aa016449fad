"""Runs a pinned workload for real and records per-phase peak memory (memplan.measured/v1).

On CUDA the caching allocator's counters are read (max_memory_allocated, reset between phases); on CPU
the LD_PRELOAD tracker (csrc/memtrack.c) counts live bytes of allocations >= its threshold.
"""

import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from . import compat, harness, tracker
from .workload import validate

SCHEMA = "memplan.measured/v1"
PHASES = ("forward", "backward", "optimizer")


class MeasureError(RuntimeError):
    pass


class _CudaMem:
    kind = "cuda"

    def __init__(self, device):
        self.device = device

    def sync(self):
        torch.cuda.synchronize(self.device)

    def live(self):
        self.sync()
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self):
        self.sync()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self):
        self.sync()
        return torch.cuda.max_memory_allocated(self.device)

    def all_peak(self):
        return None

    def all_live(self):
        return None

    def info(self):
        return {"kind": "cuda_caching_allocator", "counter": "torch.cuda.max_memory_allocated",
                "device_name": torch.cuda.get_device_name(self.device)}


class _CpuMem:
    kind = "cpu"

    def __init__(self, counters):
        self.c = counters

    def sync(self):
        pass

    # primary counter: the aligned family (posix_memalign, aligned_alloc, memalign, valloc, pvalloc),
    # which is how c10's CPU allocator allocates every tensor and oneDNN its scratch buffers;
    # Python objects (plain malloc) stay out of it. The all-functions counter is reported beside it.
    def live(self):
        return self.c.aligned_live()

    def reset_peak(self):
        self.c.reset_peak()

    def peak(self):
        return self.c.aligned_peak()

    def all_peak(self):
        return self.c.peak()

    def all_live(self):
        return self.c.live()

    def info(self):
        return {"kind": "memtrack",
                "counter": "live bytes of posix_memalign/aligned_alloc/memalign/valloc/pvalloc allocations "
                           ">= threshold (c10 CPU tensors, oneDNN scratch)",
                "all_counter": "all_phases: also malloc/calloc/realloc (includes Python objects)",
                "threshold_bytes": self.c.threshold(), "overflow": self.c.overflow()}


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise MeasureError("memplan_torch: device 'cuda' requested but torch.cuda.is_available() is False")
    return name


def find_blocks(model, path=None):
    """The ModuleList/Sequential whose children are checkpointed: `path`, or the one with most children."""
    if path:
        mods = dict(model.named_modules())
        if path not in mods:
            raise MeasureError("memplan_torch: strategy.checkpoint_blocks %r is not a module path of the model "
                               "(e.g. %s)" % (path, ", ".join(list(mods)[1:6])))
        m = mods[path]
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            raise MeasureError("memplan_torch: strategy.checkpoint_blocks %r is a %s, not a ModuleList or "
                               "Sequential" % (path, type(m).__name__))
        return path, m
    best = None
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) > 1:
            if best is None or len(m) > len(best[1]):
                best = (n, m)
    if best is None:
        raise MeasureError("memplan_torch: strategy.checkpoint 'blocks' found no ModuleList/Sequential with "
                           "more than one child; name one with strategy.checkpoint_blocks")
    return best


def apply_checkpoint(model, path=None):
    """Wraps the forward of every child of the block list in activation checkpointing."""
    name, blocks = find_blocks(model, path)
    for child in blocks:
        orig = child.forward

        def fwd(*args, __orig=orig, **kwargs):
            if not torch.is_grad_enabled():
                return __orig(*args, **kwargs)
            return compat.checkpoint_call(__orig, *args, **kwargs)

        child.forward = fwd
    return name, len(blocks)


def _step(job, opt, micro_inputs, micro_targets, k, mem, offload_ctx, hold="none", held=None):
    """One optimizer step of k micro-steps. hold (workload hold_outputs) is how long the loop keeps the model's
    output: "none" drops it once the loss exists, "backward" after loss.backward(), "next-forward" keeps it in
    held["out"] until the next forward returns (so across steps, through the optimizer)."""
    if held is None:
        held = {}
    phases = {p: 0 for p in PHASES}
    allp = {p: 0 for p in PHASES}
    mem.sync()
    base = mem.live()
    all_base = mem.all_live()
    t0 = time.perf_counter()
    for i in range(k):
        mem.reset_peak()
        with offload_ctx():
            out = job.forward(micro_inputs[i])
            if hold == "next-forward":
                held["out"] = out  # rebinds the loop's variable: the previous output dies here
            loss = job.loss(out, micro_targets[i] if micro_targets is not None else None)
            if hold != "backward":
                del out
            if k > 1:
                loss = loss / k
            phases["forward"] = max(phases["forward"], mem.peak())
            allp["forward"] = max(allp["forward"], mem.all_peak() or 0)
            mem.reset_peak()
            loss.backward()
            del loss
            if hold == "backward":
                del out
        phases["backward"] = max(phases["backward"], mem.peak())
        allp["backward"] = max(allp["backward"], mem.all_peak() or 0)
    mem.reset_peak()
    opt.step()
    compat.zero_grad(opt)
    phases["optimizer"] = mem.peak()
    allp["optimizer"] = mem.all_peak() or 0
    mem.sync()
    dt = time.perf_counter() - t0
    end = mem.live()
    peak_phase = max(PHASES, key=lambda p: phases[p])
    res = {"phases": phases, "peak_bytes": phases[peak_phase], "peak_phase": peak_phase,
           "baseline_bytes": base, "end_bytes": end, "step_time_s": dt}
    if mem.kind == "cpu":
        res["all_phases"] = allp
        res["all_baseline_bytes"] = all_base
    return res


def _less_floor(r, floor, afloor):
    r["phases"] = {p: v - floor for p, v in r["phases"].items()}
    if "all_phases" in r:
        r["all_phases"] = {p: v - afloor for p, v in r["all_phases"].items()}
        r["all_baseline_bytes"] -= afloor
    for key in ("peak_bytes", "baseline_bytes", "end_bytes"):
        r[key] -= floor
    return r


def measure_workload(w, mem=None):
    """Measures one validated workload in this process; returns its case dict."""
    w = validate(dict(w))
    device = resolve_device(w["device"])
    notes = []
    if mem is None:
        if device == "cuda":
            mem = _CudaMem(torch.device("cuda"))
        else:
            c = tracker.counters()
            if c is None:
                raise MeasureError("memplan_torch: CPU measurement needs the tracker preloaded; run "
                                   "`python3 -m memplan_torch measure` (it re-executes itself under "
                                   "LD_PRELOAD) or call memplan_torch.measure()")
            mem = _CpuMem(c)
    dtype = compat.parse_dtype(w["dtype"])
    compat.warm_up_optimizer(lambda ps: harness.make_optimizer(w["optimizer"], ps, foreach=w["foreach"]),
                             device, dtype)
    gc.collect()
    floor = mem.live()  # bytes alive before the workload exists (process, libraries); subtracted below
    afloor = mem.all_live() or 0
    torch.manual_seed(w["seed"])
    builder = harness.load_builder(w["model"])
    job = harness.call_builder(builder, w["batch"], w["seq_len"], **w["model_args"])
    harness.to_device(job, device, dtype)
    job.model.train()
    s = w["strategy"]
    k = s["accumulation"]
    strat = dict(s)
    if s["checkpoint"] == "blocks":
        name, n = apply_checkpoint(job.model, s["checkpoint_blocks"])
        strat["checkpoint_blocks"] = name
        strat["checkpoint_count"] = n
        strat["checkpoint_mode"] = compat.checkpoint_mode()
    offload_ctx = contextlib.nullcontext
    if s["offload"] == "activations":
        pin = device == "cuda"
        offload_ctx = lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)
        if device == "cpu":
            notes.append("offload on a CPU device copies saved tensors within host memory; it saves nothing")
    opt = harness.make_optimizer(w["optimizer"], job.model.parameters(), foreach=w["foreach"])
    micro_inputs = harness.chunk(job.inputs, w["batch_dim"], k)
    micro_targets = harness.chunk(job.targets, w["batch_dim"], k) if job.targets is not None else None
    params = list(job.model.parameters())
    n_params = sum(p.numel() for p in params)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    del params

    hold, held = w["hold_outputs"], {}
    first = _less_floor(_step(job, opt, micro_inputs, micro_targets, k, mem, offload_ctx, hold, held), floor,
                        afloor)
    for _ in range(w["warmup"]):
        _step(job, opt, micro_inputs, micro_targets, k, mem, offload_ctx, hold, held)
    runs = [_less_floor(_step(job, opt, micro_inputs, micro_targets, k, mem, offload_ctx, hold, held), floor,
                        afloor) for _ in range(w["iters"])]
    held.clear()
    phases = {p: max(r["phases"][p] for r in runs) for p in PHASES}
    peak_phase = max(PHASES, key=lambda p: phases[p])
    case = {
        "name": w["name"],
        "workload": w,
        "device": device,
        "torch": compat.TORCH_VERSION,
        "dtype": w["dtype"],
        "batch": w["batch"],
        "micro_batch": w["batch"] // k,
        "seq_len": w["seq_len"],
        "strategy": strat,
        "n_params": n_params,
        "param_bytes": param_bytes,
        "phases": phases,
        "peak_bytes": phases[peak_phase],
        "peak_phase": peak_phase,
        "baseline_bytes": runs[-1]["baseline_bytes"],
        "end_bytes": runs[-1]["end_bytes"],
        "step_time_s": statistics.median(r["step_time_s"] for r in runs),
        "step_times_s": [round(r["step_time_s"], 6) for r in runs],
        "phases_spread": {p: max(r["phases"][p] for r in runs) - min(r["phases"][p] for r in runs)
                          for p in PHASES},
        "first_step": {k2: first[k2] for k2 in ("phases", "peak_bytes", "peak_phase", "baseline_bytes",
                                                 "end_bytes", "step_time_s")},
        "floor_bytes": floor,
        "all_floor_bytes": afloor if mem.kind == "cpu" else None,
        "memory": mem.info(),
        "notes": notes,
    }
    if mem.kind == "cpu":
        case["all_phases"] = {p: max(r["all_phases"][p] for r in runs) for p in PHASES}
        case["all_baseline_bytes"] = runs[-1]["all_baseline_bytes"]
        case["first_step"]["all_phases"] = first["all_phases"]
    if device == "cuda":
        case["reserved_peak_bytes"] = torch.cuda.max_memory_reserved()
    del job, opt, micro_inputs, micro_targets
    gc.collect()
    return case


def measure_each(workloads, where, done=None):
    """Measures each workload in turn (where: the file or name of each, for messages), calling done(case) after
    each; one that fails does not discard the others (issue 15 item 9). Returns the cases measured and one line
    per workload that failed, naming it."""
    from .atomic import one_line
    cases, failed = [], []
    for w, at in zip(workloads, where):
        try:
            c = measure_workload(w)
        except Exception as err:  # the builder's own error, torch's out-of-memory, a MeasureError ...
            failed.append("memplan_torch: measure: case %s (%s) failed: %s" % (w["name"], at, one_line(err)))
            continue
        cases.append(c)
        if done:
            done(c)
    return cases, failed


def document(cases):
    return {"schema": SCHEMA, "producer": {"tool": "memplan_torch", "torch": compat.TORCH_VERSION,
                                           "python": sys.version.split()[0]},
            "cases": cases}


def needs_tracker(workloads):
    return any(resolve_device(w["device"]) == "cpu" for w in workloads)


def measure(workloads, out=None, threshold=tracker.DEFAULT_THRESHOLD):
    """Measures workloads (validated dicts or paths of workload files). On CPU without the tracker
    preloaded, runs the measurement in a child process under LD_PRELOAD. Returns the document and
    writes it to `out` when given. A workload that fails does not discard the others: they are written to `out`,
    then MeasureError names the ones that failed."""
    from .export import write_json
    from .workload import load
    ws = [load(w) if isinstance(w, str) else validate(dict(w)) for w in workloads]
    if needs_tracker(ws) and tracker.counters() is None:
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, w in enumerate(ws):
                p = os.path.join(d, "w%d.json" % i)
                with open(p, "w") as f:
                    json.dump(w, f)
                paths.append(p)
            res = os.path.join(d, "measured.json")
            env = tracker.preload_env(threshold)
            pp = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
            pp += [p for p in sys.path if p and os.path.isdir(p)]
            env["PYTHONPATH"] = os.pathsep.join(pp)
            r = subprocess.run([sys.executable, "-m", "memplan_torch", "measure"] + paths + ["--out", res],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=os.getcwd())
            failed = []
            if r.returncode != 0:
                # The child's lines name its temporary copies: named back as the caller gave them, and kept to
                # the last few lines, one message.
                text = r.stdout.decode(errors="replace")
                for i, (p, w) in enumerate(zip(paths, workloads)):
                    text = text.replace(p, w if isinstance(w, str) else str(w.get("name") or "workload %d" % i))
                lines = [l.strip() for l in text.splitlines() if l.strip()][-5:]
                failed = ["memplan_torch: measurement failed: %s" % (" | ".join(lines) or "exit %d" % r.returncode)]
            doc = document([])
            if os.path.exists(res):  # the cases measured, though another failed
                with open(res) as f:
                    doc = json.load(f)
    else:
        cases, failed = measure_each(ws, [w if isinstance(w, str) else w["name"] for w in workloads])
        doc = document(cases)
    if out and (doc["cases"] or not failed):
        write_json(doc, out)
    if failed:
        raise MeasureError("; ".join(failed))
    return doc
