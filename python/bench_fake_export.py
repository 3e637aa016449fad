#!/usr/bin/env python3
"""Measures fake execution (export --fake, PyTorch 2.x) against real execution (--device cpu).

    $(python/torch2_venv.sh) python/bench_fake_export.py                 # all parts (about 10 minutes, 2 cores)
    $(python/torch2_venv.sh) python/bench_fake_export.py --ops-only
    $(python/torch2_venv.sh) python/bench_fake_export.py --suite-only [--traces lm,gru]
    $(python/torch2_venv.sh) python/bench_fake_export.py --llama-only [--batch 1 --seq 2048 --layers 32]
    $(python/torch2_venv.sh) python/bench_fake_export.py --breakdown lm     # where a fake export's CPU goes

0. Per-op cost (the floor of any fake export): one aten op on small tensors, run for real, on the meta device
   and under a bare FakeTensorMode, and the same under the exporter's recorder; microseconds of CPU per op.
1. The validation suite's traces (memplan_torch.suite.TRACES) and larger models (llama_medium, 58M parameters,
   at seq 256 and 1024): export time real vs fake, in this process, each export once after one untimed warm-up
   export (imports, first-use caches); CPU seconds of this process (user + system: steadier than wall time on
   a shared machine; wall is printed too) and the speedup in CPU time; checks the two documents are the same
   trace (see tests/test_fake.py). The real export traces two whole steps at each fit point (2, or 6 with a
   sequence fit); the fake one traces two at the first point and, at the others, one step after an
   optimizer-only first step (export._run_fake_traces).
2. Llama-3-8B's shape (memplan_torch.models.llama3_8b: hidden 4096, 32 layers, 32 heads, 8 kv heads,
   intermediate 14336, vocab 128256, bfloat16, AdamW) exported with --fake at batch 1 (and 2, the second fit
   point), seq 2048, in a fresh process: wall time of the whole command (including importing torch) and its
   peak RSS. Run for real this step would need about 64 GB (bf16 weights, gradients, AdamW state) plus
   activations; fake, it needs none of it.

Not run by CI (minutes of CPU).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _cpu():
    return time.process_time()  # user + system CPU of every thread of this process


OPS = {
    "add": lambda a, b: a + b,
    "relu": lambda a, b: torch.relu(a),
    "mm": lambda a, b: a.view(-1, 64) @ b,
    "view": lambda a, b: a.view(-1, 64),
}


def bench_ops(out=print, n=2000):
    """CPU microseconds per op on a [2, 64, 64] float32 tensor (and a [64, 64] one): real, meta, under a bare
    FakeTensorMode, and under FakeTensorMode with the exporter's recorder above it (as in export --fake)."""
    global torch
    import torch
    from memplan_torch import compat
    from memplan_torch.trace import Recorder

    def per_op(fn, ctx=None):
        import contextlib
        with (ctx or contextlib.nullcontext()):
            for _ in range(50):
                fn()
            t0 = _cpu()
            for _ in range(n):
                fn()
            return (_cpu() - t0) / n * 1e6

    rows = []
    out("%-6s %9s %9s %9s %14s   (CPU us per op)" % ("op", "real", "meta", "fake", "fake+recorder"))
    x, w = torch.randn(2, 64, 64), torch.randn(64, 64)
    mx, mw = x.to("meta"), w.to("meta")
    fm = compat.new_fake_mode()
    fx, fw = fm.from_tensor(x), fm.from_tensor(w)
    for name, f in OPS.items():
        real = per_op(lambda: f(x, w))
        meta = per_op(lambda: f(mx, mw))
        with fm:
            fake = per_op(lambda: f(fx, fw))
            rec = Recorder("cpu", fake=True)
            with rec:
                recorded = per_op(lambda: f(fx, fw))
                rec.events.clear()
        rows.append(dict(op=name, real_us=round(real, 1), meta_us=round(meta, 1), fake_us=round(fake, 1),
                         fake_recorded_us=round(recorded, 1)))
        out("%-6s %9.1f %9.1f %9.1f %14.1f" % (name, real, meta, fake, recorded))
    return rows


BIG = {
    "llama_medium": dict(model="memplan_torch.models:llama_medium", optimizer="adamw", batch=2, seq_len=256),
    "llama_medium_s1024": dict(model="memplan_torch.models:llama_medium", optimizer="adamw", batch=2,
                               seq_len=1024),
}


def bench_suite(names=None, out=print):
    from memplan_torch.export import export_builder
    from memplan_torch.suite import TRACES
    sys.path.insert(0, os.path.join(HERE, "tests"))
    from test_fake import comparable, first_difference  # noqa: E402

    rows = []
    traces = dict(TRACES, **BIG)
    with tempfile.TemporaryDirectory() as d:
        # warm-up: first-use costs (FakeTensorMode's imports, dispatch tables) are not either mode's per-export cost
        export_builder("memplan_torch.models:mlp", os.path.join(d, "w.json"), device="cpu")
        export_builder("memplan_torch.models:mlp", os.path.join(d, "w.json"), fake=True)
        out("%-22s %6s %6s %9s %9s %8s %8s %8s  %s" % ("trace", "events", "points", "real_cpu", "fake_cpu",
                                                      "speedup", "real_wall", "fake_wall", "same trace"))
        for name in (names or sorted(traces)):
            t = traces[name]
            kw = dict(batch=t["batch"], seq_len=t.get("seq_len"), optimizer=t["optimizer"],
                      seq_dim=t.get("seq_dim"), foreach=False, name=name)
            c0, w0 = _cpu(), time.perf_counter()
            real = export_builder(t["model"], os.path.join(d, "r.json"), device="cpu", **kw)
            rc, rw = _cpu() - c0, time.perf_counter() - w0
            c0, w0 = _cpu(), time.perf_counter()
            fake = export_builder(t["model"], os.path.join(d, "f.json"), fake=True, **kw)
            fc, fw = _cpu() - c0, time.perf_counter() - w0
            same = first_difference(comparable(real), comparable(fake)) is None
            rows.append(dict(trace=name, events=len(real["events"]), points=len(real["fit_points"]),
                             real_cpu_s=round(rc, 2), fake_cpu_s=round(fc, 2), speedup=round(rc / fc, 2),
                             real_wall_s=round(rw, 2), fake_wall_s=round(fw, 2), same=same))
            out("%-22s %6d %6d %9.2f %9.2f %7.2fx %8.2f %8.2f  %s" % (
                name, len(real["events"]), len(real["fit_points"]), rc, fc, rc / fc, rw, fw, same))
    suite = [r for r in rows if r["trace"] in TRACES]
    if suite:
        tr, tf = sum(r["real_cpu_s"] for r in suite), sum(r["fake_cpu_s"] for r in suite)
        out("%-22s %6s %6s %9.2f %9.2f %7.2fx   (the suite's traces)" % ("total", "", "", tr, tf, tr / tf))
    return rows


def _exclusive_timers(targets):
    """Wraps each (class, method, label) so that its CPU time, less that of the wrapped methods it calls, adds
    up under its label: {label: [calls, seconds]}. Returns the totals and a function that unwraps."""
    acc, stack, undo = {}, [], []
    for cls, attr, label in targets:
        f = cls.__dict__[attr]

        def g(*a, _f=f, _label=label, **k):
            t0 = _cpu()
            stack.append(0.0)
            try:
                return _f(*a, **k)
            finally:
                d = _cpu() - t0
                child = stack.pop()
                if stack:
                    stack[-1] += d
                s = acc.setdefault(_label, [0, 0.0])
                s[0] += 1
                s[1] += d - child
        setattr(cls, attr, g)
        undo.append((cls, attr, f))
    return acc, lambda: [setattr(c, a, f) for c, a, f in undo]


def bench_breakdown(name, out=print):
    """Where a fake export's CPU goes: FakeTensorMode's dispatch (its cache key, outputs made from a cache hit,
    the full dispatch of a miss or bypass, the rest of its __torch_dispatch__), the recorder's own work per op,
    and everything else (the model's Python code, autograd's engine, fitting, writing JSON); each part's own
    time, without what it calls of the others. The timers cost CPU too (the total is higher than unwrapped)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from memplan_torch.export import export_builder
    from memplan_torch.suite import TRACES
    from memplan_torch.trace import Recorder
    t = dict(TRACES, **BIG)[name]
    kw = dict(batch=t["batch"], seq_len=t.get("seq_len"), optimizer=t["optimizer"], seq_dim=t.get("seq_dim"),
              foreach=False, name=name)
    with tempfile.TemporaryDirectory() as d:
        export_builder("memplan_torch.models:mlp", os.path.join(d, "w.json"), fake=True)  # warm-up
        acc, undo = _exclusive_timers([
            (FakeTensorMode, "_cache_key", "FakeTensorMode: cache key"),
            (FakeTensorMode, "_output_from_cache_entry", "FakeTensorMode: output of a cache hit"),
            (FakeTensorMode, "_dispatch_impl", "FakeTensorMode: miss or bypass (meta kernel, decomposition)"),
            (FakeTensorMode, "__torch_dispatch__", "FakeTensorMode: rest of __torch_dispatch__"),
            (Recorder, "__torch_dispatch__", "recorder (memplan_torch.trace)")])
        FakeTensorMode.cache_clear()
        c0 = _cpu()
        try:
            export_builder(t["model"], os.path.join(d, "f.json"), fake=True, **kw)
        finally:
            undo()
        total = _cpu() - c0
    info = FakeTensorMode.cache_info()
    out("%s fake export, %.2f s CPU with timers; FakeTensorMode cache: %d hits, %d misses, bypasses %s"
        % (name, total, info.hits, info.misses, dict(info.bypasses)))
    rows = {"total_cpu_s": round(total, 2)}
    for label, (n, sec) in acc.items():
        out("  %-62s %7d calls %7.2f s %6.1f%% %7.1f us/call" % (label, n, sec, 100 * sec / total, sec / n * 1e6))
        rows[label] = dict(calls=n, cpu_s=round(sec, 2))
    rest = total - sum(sec for _, sec in acc.values())
    out("  %-62s %13s %7.2f s %6.1f%%" % ("everything else", "", rest, 100 * rest / total))
    return rows


def bench_llama(batch=1, seq=2048, layers=32, out=print):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "llama3_8b.json")
        cmd = [sys.executable, "-m", "memplan_torch", "export", "memplan_torch.models:llama3_8b", "--fake",
               "--batch", str(batch), "--seq-len", str(seq), "--out", path]
        env = dict(os.environ, PYTHONPATH=HERE)
        if layers != 32:  # a shallower model through a tiny builder module
            mod = os.path.join(d, "llama_layers.py")
            with open(mod, "w") as f:
                f.write("from memplan_torch.models import llama3_8b\n"
                        "def build(batch_size, seq_len=2048):\n"
                        "    return llama3_8b(batch_size, seq_len, layers=%d)\n" % layers)
            cmd[4] = "llama_layers:build"
            env["PYTHONPATH"] = os.pathsep.join([HERE, d])
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=d)
        wall = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss_kb, cpu_s = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
        if r.returncode != 0:
            raise SystemExit("llama export failed:\n" + r.stdout.decode())
        doc = json.load(open(path))
    res = dict(batch=batch, seq=seq, layers=layers, n_params=doc["n_params"], events=len(doc["events"]),
               wall_s=round(wall, 1), cpu_s=round(cpu_s, 1), export_s=doc["producer"]["elapsed_s"],
               peak_rss_gib=round(rss_kb / 2 ** 20, 2), load_avg_1min=os.getloadavg()[0])
    out("llama-3-8b shape (%d layers, %.2fB params) fake export at batch %d seq %d: %d events, %.1f s wall "
        "(%.1f s tracing, the rest importing), %.1f s CPU, peak RSS %.2f GiB (load average %.1f)"
        % (layers, doc["n_params"] / 1e9, batch, seq, res["events"], wall, res["export_s"], res["cpu_s"],
           res["peak_rss_gib"], res["load_avg_1min"]))
    return res


def _trace_names():
    from memplan_torch.suite import TRACES
    return sorted(dict(TRACES, **BIG))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ops-only", action="store_true")
    g.add_argument("--suite-only", action="store_true")
    g.add_argument("--llama-only", action="store_true")
    g.add_argument("--breakdown", metavar="TRACE", default=None,
                   help="only: where one trace's fake export spends its CPU (FakeTensorMode vs the recorder)")
    p.add_argument("--traces", default=None, help="comma-separated trace names (suite.TRACES, %s)" % ", ".join(BIG))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    from memplan_torch import compat
    if not compat.fake_tensors_available():
        raise SystemExit("bench_fake_export: fake execution needs PyTorch 2.x; run it with $(python/torch2_venv.sh)")
    res = {"torch": compat.TORCH_VERSION, "cpus": os.cpu_count(), "load_avg_1min": os.getloadavg()[0]}
    print("torch %s, %d CPUs, load average %.1f" % (res["torch"], res["cpus"], res["load_avg_1min"]))
    if a.breakdown:
        if a.breakdown not in _trace_names():
            raise SystemExit("bench_fake_export: --breakdown %r is not a trace (%s)" % (a.breakdown,
                                                                                     ", ".join(_trace_names())))
        res["breakdown"] = bench_breakdown(a.breakdown)
    elif not (a.suite_only or a.llama_only):
        res["ops"] = bench_ops()
    if not (a.ops_only or a.llama_only or a.breakdown):
        res["suite"] = bench_suite(a.traces.split(",") if a.traces else None)
    if not (a.ops_only or a.suite_only or a.breakdown):
        res["llama3_8b"] = bench_llama(a.batch, a.seq, a.layers)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
