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
