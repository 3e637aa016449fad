"""The framework suite (memplan_torch/frameworks.py): one real training step of transformers' Trainer (+ peft),
litgpt and torchtune on CPU, measured with the allocation tracker, against memplan's catalog path (`memplan plan
--recipe hf|litgpt|torchtune`) and the trace path. Measured here; the bar is 3% per phase unless a case's
difference is explained in frameworks.EXPLAINED (the mechanism, with the framework source that shows it)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from memplan_torch import compat, frameworks as F

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)

HAVE = all(importlib.util.find_spec(m) is not None
           for m in ("transformers", "peft", "accelerate", "lightning", "litgpt", "torchtune", "torchao"))
needs_frameworks = pytest.mark.skipif(
    not (compat.fake_tensors_available() and HAVE),
    reason="the framework suite needs PyTorch 2.x with transformers, peft, accelerate, lightning, litgpt, "
           "torchtune and torchao (python/requirements-torch2.txt, requirements-torch2-nodeps.txt)")

TOL = 0.03


def test_plan_args_follow_the_case():
    a = F.plan_args(F.case_by_name("hf-lora-amp"))
    assert a[a.index("--recipe") + 1] == "hf" and a[a.index("--precision") + 1] == "amp-bf16"
    assert a[a.index("--lora") + 1] == "r=8,alpha=16,dropout=0.05,targets=q_proj,v_proj"
    assert "optimizer.impl=single" in a and a[a.index("--kernels") + 1] == "cpu"
    t = F.plan_args(F.case_by_name("torchtune-full-bf16-inbwd"))
    assert "optimizer.in-backward=true" in t and "optimizer.impl=single" not in t  # torchtune's fused AdamW
    h5 = F.plan_args(F.case_by_name("hf5-full-moe"))
    # the recipe's defaults decide: the checkpoint's dtype (config.json), its fused AdamW (CPU has the kernel)
    assert h5[h5.index("--recipe") + 1] == "hf5" and "--precision" not in h5 and "optimizer.impl=single" not in h5
    lit = F.plan_args(F.case_by_name("litgpt-lora-bf16"))
    assert lit[lit.index("--lora") + 1].endswith("targets=qkv_proj,qkv=q+v")
    gc = F.plan_args(F.case_by_name("hf-full-amp-gc"))
    assert gc[gc.index("--checkpoint") + 1] == "full" and "--checkpoint" not in F.plan_args(F.case_by_name("hf-full-amp"))
    full = F.plan_args(F.case_by_name("litgpt-full-bf16"))
    assert "loss=chunked:rows=128,fp32-outputs" in full and "kernels.rms-norm=fp32-weight" in full


def test_bad_input_one_line():
    env = dict(os.environ, PYTHONPATH=PY_ROOT)
    for args, want in ((["--cases", "hf-nosuch"], "unknown case 'hf-nosuch'"),
                       (["--trace", "nosuch"], "unknown case 'nosuch'"),
                       (["--memplan", "/nonexistent/memplan"], "--memplan /nonexistent/memplan is not an executable"),
                       (["--memplan", sys.executable, "--out", "/proc/memplan-frameworks"], "--out /proc/memplan")):
        r = subprocess.run([sys.executable, "-m", "memplan_torch.frameworks"] + args, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = r.stderr.decode().strip()
        assert r.returncode == 1 and want in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_explained_cases_exist():
    names = {c["name"] for c in F.CASES}
    for (case, path), ex in F.EXPLAINED.items():
        assert case in names and path in ("catalog", "trace") and ex["why"]
        assert set(ex["phases"]) <= set(F.PHASES) and all(lo < hi for lo, hi in ex["phases"].values())


def test_unexplained_flags_new_gaps(monkeypatch):
    row = {"case": "hf-full-amp", "catalog_error": {"forward": 0.01, "backward": -0.05, "optimizer": None},
           "trace_error": {"forward": 0.0, "backward": 0.0, "optimizer": 0.031}}
    assert F.unexplained([row]) == ["hf-full-amp catalog backward: -5.00%", "hf-full-amp trace optimizer: +3.10%"]
    monkeypatch.setitem(F.EXPLAINED, ("hf-full-amp", "catalog"),
                        dict(phases={"backward": (-0.06, -0.04)}, why="a test's explanation"))
    assert F.unexplained([row]) == ["hf-full-amp trace optimizer: +3.10%"]
    row["catalog_error"]["backward"] = -0.2
    assert F.unexplained([row])[0] == "hf-full-amp catalog backward: -20.00% (explained for -6.0% to -4.0%)"


@pytest.fixture(scope="module")
def rows(tmp_path_factory, memplan_bin):
    if memplan_bin is None:
        pytest.skip("needs Go to build memplan")
    # scripts/test.sh sets MEMPLAN_FRAMEWORKS_OUT to print the table (DIR/table.md) after the run
    out = os.environ.get("MEMPLAN_FRAMEWORKS_OUT") or str(tmp_path_factory.mktemp("frameworks"))
    return F.run(out, memplan_bin, log=lambda *a: None)


@needs_frameworks
def test_every_case_ran_its_framework(rows):
    assert [r["case"] for r in rows] == [c["name"] for c in F.CASES]
    for r in rows:
        m = r["measured"]
        # every phase was marked (optimizer-in-backward has no optimizer phase of its own) and the model's
        # parameters were live
        phases = [p for p in F.PHASES if not (r["in_backward"] and p == "optimizer")]
        assert all(m["phases"][p] > 0 for p in phases), (r["case"], m["phases"])
        assert m["peak_bytes"] > 1_000_000
    # precisions covered: pure bf16 and CPU autocast bf16
    assert {r["precision"] for r in rows} >= {"pure-bf16", "amp-bf16"}


@needs_frameworks
def test_hf5_cases_ran_transformers_5_defaults(rows):
    """What the hf5 recipe says of transformers 5.x held in the measured runs: the Trainer's default optim is the
    fused AdamW, the checkpoint's bfloat16 is what trains, a mixture runs grouped_mm."""
    h5 = {r["case"]: r["measured"] for r in rows if r["framework"] == "hf5"}
    assert set(h5) == {"hf5-full-gqa", "hf5-lora-gqa", "hf5-full-moe", "hf5-lora-gqa-noflag"}
    for name, m in h5.items():
        assert m["optim"].endswith("ADAMW_TORCH_FUSED"), (name, m["optim"])
    assert h5["hf5-full-gqa"]["trainable_dtypes"] == ["torch.bfloat16"]
    assert h5["hf5-lora-gqa"]["trainable_dtypes"] == ["torch.float32"]  # peft's autocast_adapter_dtype
    assert h5["hf5-full-moe"]["experts"] == "grouped_mm"


@needs_frameworks
def test_traced_cases(rows):
    traced = [r for r in rows if r["trace"] is not None and "error" not in r["trace"]]
    assert {r["case"] for r in traced} == set(F.TRACED)


@needs_frameworks
def test_within_3_percent_or_explained(rows):
    bad = F.unexplained(rows, TOL)
    assert not bad, "; ".join(bad)
