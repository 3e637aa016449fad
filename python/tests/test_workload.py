import json

import pytest

from memplan_torch.workload import WorkloadError, load, validate

GOOD = """
schema: memplan.workload/v1
name: tiny
model: builders:wide_mlp
dtype: float32
batch: 8
warmup: 0
iters: 1
optimizer: sgd-momentum
strategy:
  accumulation: 2
  checkpoint: none
"""


def test_loads_yaml_with_defaults(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(GOOD)
    w = load(str(p))
    assert w["batch"] == 8 and w["device"] == "auto" and w["seed"] == 0
    assert w["strategy"] == {"accumulation": 2, "checkpoint": "none", "checkpoint_blocks": None, "offload": "none"}


def test_json_workload(tmp_path):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"model": "builders:wide_mlp", "batch": 4}))
    assert load(str(p))["optimizer"] == "adamw"


@pytest.mark.parametrize("patch,needle", [
    ({"bacth": 8}, "unknown field 'bacth'"),
    ({"batch": "8"}, "field 'batch' must be a integer"),
    ({"optimizer": "adam"}, "unknown optimizer 'adam'"),
    ({"dtype": "int8"}, "field 'dtype'"),
    ({"strategy": {"checkpointing": "blocks"}}, "strategy: unknown field 'checkpointing'"),
    ({"strategy": {"accumulation": 3}}, "must be divisible by 'strategy.accumulation' (3)"),
    ({"strategy": {"offload": "weights"}}, "field 'strategy.offload' must be one of none, activations"),
    ({"model": "nocolon"}, "field 'model' must be MODULE:FUNCTION"),
    ({"device": "tpu"}, "field 'device' must be one of"),
    ({"iters": True}, "field 'iters' must be a integer"),
])
def test_wrong_fields_are_named(patch, needle):
    w = {"model": "builders:wide_mlp", "batch": 8}
    w.update(patch)
    with pytest.raises(WorkloadError) as ei:
        validate(w)
    assert needle in str(ei.value)


def test_missing_required():
    with pytest.raises(WorkloadError) as ei:
        validate({"model": "builders:wide_mlp"})
    assert "missing required field 'batch'" in str(ei.value)
