import pytest

from memplan_torch.align import check_alignment, check_workload
from memplan_torch import harness, models
import builders


def test_mlp_aligns():
    rep = check_alignment(harness.Job(*models.mlp(16)), k=4)
    assert rep["aligned"], rep
    assert rep["effective_batch"] == 16 and rep["micro_batch"] == 4
    assert rep["max_rel_diff"] <= rep["tolerance_rel"]


def test_batchnorm_does_not_align():
    rep = check_alignment(harness.Job(*models.mlp_bn(16)), k=4)
    assert not rep["aligned"]
    assert any("BatchNorm" in r for r in rep["reasons"])


def test_sum_loss_is_explained():
    rep = check_alignment(harness.Job(*builders.mlp_sum_loss(8)), k=2)
    assert not rep["aligned"]
    assert any("sums over the batch" in r for r in rep["reasons"])


def test_workload_alignment_with_dropout_model():
    rep = check_workload({"model": "memplan_torch.models:transformer_lm", "batch": 4, "seq_len": 8,
                          "model_args": {"layers": 1}, "strategy": {"accumulation": 2}})
    assert rep["aligned"], rep
    assert any("dropout" in n for n in rep["notes"])


def test_accumulation_one_is_refused():
    with pytest.raises(ValueError) as ei:
        check_workload({"model": "memplan_torch.models:mlp", "batch": 4})
    assert "accumulation" in str(ei.value)


def test_align_cli_exit_status(tmp_path):
    import os, subprocess, sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    p = tmp_path / "bn.yaml"
    p.write_text("model: memplan_torch.models:mlp_bn\nbatch: 16\nstrategy: {accumulation: 4}\n")
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "align", str(p)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = r.stdout.decode()
    assert r.returncode == 1 and "NOT ALIGNED" in out and "BatchNorm" in out and "effective batch 16" in out
    p.write_text("model: memplan_torch.models:mlp\nbatch: 16\nstrategy: {accumulation: 4}\n")
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "align", str(p)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 0 and "ALIGNED" in r.stdout.decode()
