"""torch.profiler's memory timeline, recorded now, read by `memplan explain` (issue 11).

python/profiler_timeline.py profiles two AdamW steps of a small model on CPU and exports the three data forms
export_memory_timeline writes; memplan explain must find each file's own peak (the largest row sum of the
[times, sizes] file) and put it on its ledger lines. PyTorch 2.1+ (Debian's 1.13 has no memory timeline).
"""
import gzip
import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "profiler_timeline.py")

pytestmark = pytest.mark.skipif(not hasattr(torch.profiler.profile, "export_memory_timeline"),
                                reason="torch.profiler has no export_memory_timeline before PyTorch 2.1")


def test_explain_reads_fresh_timelines(tmp_path, memplan_bin):
    subprocess.run([sys.executable, SCRIPT, str(tmp_path)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    times, sizes = json.load(open(tmp_path / "cpu_mlp_step.json"))
    own = max(sum(r) for r in sizes)
    raw = json.load(gzip.open(tmp_path / "cpu_mlp_step.raw.json.gz", "rt"))
    assert raw and all(len(e) == 4 for e in raw)
    if memplan_bin is None:
        pytest.skip("no Go toolchain to build memplan")
    for name in ("cpu_mlp_step.json", "cpu_mlp_step.json.gz", "cpu_mlp_step.raw.json.gz"):
        r = subprocess.run([memplan_bin, "explain", str(tmp_path / name), "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        peak = rep["peak_allocated"]
        assert peak["bytes"] == own, (name, peak["bytes"], own)
        assert sum(s["bytes"] for s in peak["by_category"]) == own
        assert peak["classified"] >= 0.95
