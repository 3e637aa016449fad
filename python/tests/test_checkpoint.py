"""Models that checkpoint themselves (torch.utils.checkpoint inside forward, as Hugging Face models do after
gradient_checkpointing_enable()): the export records the recompute inside backward, where it runs, and the
trace predicts the measured per-phase peaks."""

import pytest

from memplan_torch import compat
from memplan_torch.export import export_builder
from memplan_torch.measure import measure
from memplan_torch.replay import replay
from memplan_torch.schema import validate_trace

M = "memplan_torch.models:"
BUILDERS = {"non-reentrant": "transformer_lm_ckpt", "reentrant": "transformer_lm_ckpt_reentrant"}


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory):
    return export_builder(M + "transformer_lm", str(tmp_path_factory.mktemp("plain") / "t.json"), batch=2,
                          seq_len=32, device="cpu", optimizer="adamw", foreach=False)


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_self_checkpointing_model_exports_and_predicts_measured_peaks(tmp_path, mode, plain_trace):
    if mode == "non-reentrant" and not compat.checkpoint_supports_non_reentrant():  # pragma: no cover
        pytest.skip("torch %s has no use_reentrant=False checkpointing" % compat.TORCH_VERSION)
    spec = M + BUILDERS[mode]
    doc = export_builder(spec, str(tmp_path / "t.json"), batch=2, seq_len=32, device="cpu", optimizer="adamw",
                         foreach=False)
    validate_trace(doc)
    ev = doc["events"]
    # the recompute is in backward: each layer's forward ops run again there, in the layer's modules, and
    # what they save for the layer's backward is marked saved (an activation) and freed in backward
    bwd = [e for e in ev if e["phase"] == "backward"]
    fwd = [e for e in ev if e["phase"] == "forward"]
    for i in range(4):
        mod = "layers.%d.linear1" % i
        assert sum(e["op"] == "aten.addmm.default" and e["module"] == mod for e in fwd) == 1
        assert sum(e["op"] == "aten.addmm.default" and e["module"] == mod for e in bwd) == 1
    recomputed = [a for e in bwd if e["module"].startswith("layers.") for a in e["alloc"]
                  if a["saved"] and a["category"] == "activation"]
    assert recomputed
    freed_in_bwd = {f for e in bwd for f in e["free"]}
    assert {a["id"] for a in recomputed} <= freed_in_bwd
    # backward attributes the loss and head's backward to them, not to a layer a stopped recompute left
    assert {"(loss)", "head"} <= {e["module"] for e in bwd}
    # forward keeps only the layers' inputs: far less saved than the plain model's forward
    def saved_fwd(d):
        return sum(a["bytes"] for e in d["events"] if e["phase"] == "forward" for a in e["alloc"] if a["saved"])
    assert saved_fwd(doc) < 0.5 * saved_fwd(plain_trace)

    # measured for real (CPU tracker), at 4x the trace batch
    w = {"name": BUILDERS[mode], "model": spec, "batch": 8, "seq_len": 32, "device": "cpu", "warmup": 1,
         "iters": 2, "optimizer": "adamw", "foreach": False}
    c = measure([w], out=str(tmp_path / "m.json"))["cases"][0]
    r = replay(doc, 8, min_bytes=c["memory"]["threshold_bytes"])
    for p in ("forward", "backward", "optimizer"):
        err = r["phases"][p] / c["phases"][p] - 1
        assert abs(err) <= 0.03, (mode, p, r["phases"][p], c["phases"][p], err)
    assert r["peak_phase"] == c["peak_phase"]
