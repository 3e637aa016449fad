#!/usr/bin/env python3
"""Measures fake execution (export --fake, PyTorch 2.x) against real execution (--device cpu).

    $(python/torch2_venv.sh) python/bench_fake_export.py                 # both parts (about 3 minutes, 2 cores)
    $(python/torch2_venv.sh) python/bench_fake_export.py --suite-only
    $(python/torch2_venv.sh) python/bench_fake_export.py --llama-only [--batch 1 --seq 2048 --layers 32]

1. The validation suite's traces (memplan_torch.suite.TRACES) and llama_medium (58M parameters, seq 256, the
   size where computing starts to cost more than recording): export time real vs fake, in this process, each
   export once after one untimed warm-up export (imports, first-use caches); checks the two documents are the
   same trace (see tests/test_fake.py).
2. Llama-3-8B's shape (memplan_torch.models.llama3_8b: hidden 4096, 32 layers, 32 heads, 8 kv heads,
   intermediate 14336, vocab 128256, bfloat16, AdamW) exported with --fake at batch 1 (and 2, the second fit
   point), seq 2048, in a fresh process: wall time of the whole command (including importing torch) and its
   peak RSS. Run for real this step would need about 64 GB (bf16 weights, gradients, AdamW state) plus
   activations; fake, it needs none of it.

Not run by CI (the Llama part takes about half a minute and the suite part several minutes).
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


def bench_suite(names=None, out=print):
    from memplan_torch.export import export_builder
    from memplan_torch.suite import TRACES
    sys.path.insert(0, os.path.join(HERE, "tests"))
    from test_fake import comparable, first_difference  # noqa: E402

    rows = []
    with tempfile.TemporaryDirectory() as d:
        # warm-up: first-use costs (FakeTensorMode's imports, dispatch tables) are not either mode's per-export cost
        export_builder("memplan_torch.models:mlp", os.path.join(d, "w.json"), device="cpu")
        export_builder("memplan_torch.models:mlp", os.path.join(d, "w.json"), fake=True)
        out("%-14s %7s %8s %8s %8s  %s" % ("trace", "events", "real_s", "fake_s", "speedup", "same trace"))
        traces = dict(TRACES, llama_medium=dict(model="memplan_torch.models:llama_medium", optimizer="adamw",
                                                batch=2, seq_len=256))
        for name in (names or sorted(traces)):
            t = traces[name]
            kw = dict(batch=t["batch"], seq_len=t.get("seq_len"), optimizer=t["optimizer"],
                      seq_dim=t.get("seq_dim"), foreach=False, name=name)
            t0 = time.perf_counter()
            real = export_builder(t["model"], os.path.join(d, "r.json"), device="cpu", **kw)
            tr = time.perf_counter() - t0
            t0 = time.perf_counter()
            fake = export_builder(t["model"], os.path.join(d, "f.json"), fake=True, **kw)
            tf = time.perf_counter() - t0
            same = first_difference(comparable(real), comparable(fake)) is None
            rows.append(dict(trace=name, events=len(real["events"]), real_s=round(tr, 2), fake_s=round(tf, 2),
                             speedup=round(tr / tf, 2), same=same))
            out("%-14s %7d %8.2f %8.2f %7.2fx  %s" % (name, len(real["events"]), tr, tf, tr / tf, same))
    tr, tf = sum(r["real_s"] for r in rows), sum(r["fake_s"] for r in rows)
    out("%-14s %7s %8.2f %8.2f %7.2fx" % ("total", "", tr, tf, tr / tf))
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
        rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if r.returncode != 0:
            raise SystemExit("llama export failed:\n" + r.stdout.decode())
        doc = json.load(open(path))
    res = dict(batch=batch, seq=seq, layers=layers, n_params=doc["n_params"], events=len(doc["events"]),
               wall_s=round(wall, 1), export_s=doc["producer"]["elapsed_s"], peak_rss_gib=round(rss_kb / 2 ** 20, 2))
    out("llama-3-8b shape (%d layers, %.2fB params) fake export at batch %d seq %d: %d events, %.1f s wall "
        "(%.1f s tracing, the rest importing), peak RSS %.2f GiB"
        % (layers, doc["n_params"] / 1e9, batch, seq, res["events"], wall, res["export_s"], res["peak_rss_gib"]))
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--suite-only", action="store_true")
    g.add_argument("--llama-only", action="store_true")
    p.add_argument("--traces", default=None, help="comma-separated suite trace names")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    from memplan_torch import compat
    if not compat.fake_tensors_available():
        raise SystemExit("bench_fake_export: fake execution needs PyTorch 2.x; run it with $(python/torch2_venv.sh)")
    res = {"torch": compat.TORCH_VERSION, "cpus": os.cpu_count()}
    if not a.llama_only:
        res["suite"] = bench_suite(a.traces.split(",") if a.traces else None)
    if not a.suite_only:
        res["llama3_8b"] = bench_llama(a.batch, a.seq, a.layers)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
