"""An optimizer that replaces its state tensors each step (testdata/torch/replace_state.py: m = 0.9*m + g stored
back into its state dict, not updated in place; issue 10, item 6).

The exporter labels the state it holds before the steady step as optimizer state (the first step creates it),
and the first-step replay counts it once: where the first optimizer step allocates it, not also as live at the
start (memplan_torch.replay double-counted it before, 49,792 bytes: every parameter's size)."""

import copy
import importlib.util
import json
import os

import pytest

from memplan_torch import compat
from memplan_torch.export import build_trace
from memplan_torch.replay import first_step_created, replay

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(ROOT, "testdata", "torch", "replace_state")


def _module():
    spec = importlib.util.spec_from_file_location("replace_state", FIXTURE + ".py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


PARAM_BYTES = 4 * (64 * 128 + 128 + 128 * 32 + 32)  # 49,792


def _first_step_by_hand(batch):
    """The first step's phase peaks (no state at the start), derived from the model: parameters, inputs
    (float32 [batch, 64] and int64 [batch]) and, in the optimizer phase, every gradient plus the first layer's
    zeros_like, 0.9*m and the new m (3 x 32,768 bytes) at once. Forward and backward are the steady step's less
    the state (one copy of the parameters' size)."""
    inputs = batch * (64 * 4 + 8)
    return {"optimizer": PARAM_BYTES + inputs + PARAM_BYTES + 3 * 64 * 128 * 4}


def test_exporter_labels_replaced_state():
    doc = build_trace(_module().make_job, 4, optimizer=_module().ReplaceMomentum, device="cpu")
    cats = {s["id"]: s["category"] for s in doc["initial_storages"]}
    state = [i for i, c in cats.items() if c == "optimizer_state"]
    assert [cats[i] for i in sorted(cats)].count("parameter") == 4
    assert len(state) == 4, cats
    assert sorted(doc["first_step"]["optimizer_state"]) == sorted(state)
    # the first optimizer step creates the state under its initial ids, labelled as state, not temporaries
    made = [a for e in doc["first_step"]["optimizer_events"] for a in e["alloc"] if a["id"] in cats]
    assert sorted(a["id"] for a in made) == sorted(state)
    assert {a["category"] for a in made} == {"optimizer_state"}
    # the steady step's new state too; the old state it drops is freed there
    steady_new = [a for e in doc["events"] if e["phase"] == "optimizer" for a in e["alloc"]
                  if a["category"] == "optimizer_state"]
    assert sum(a["bytes"] for a in steady_new) == PARAM_BYTES
    freed = {f for e in doc["events"] if e["phase"] == "optimizer" for f in e["free"]}
    assert set(state) <= freed


def test_fixture_is_current_exporter_output():
    with open(FIXTURE + ".trace.json") as f:
        fixture = json.load(f)
    doc = build_trace(_module().make_job, 4, optimizer=_module().ReplaceMomentum, device="cpu")
    strip = lambda d: {k: v for k, v in d.items() if k not in ("producer", "source", "name")}
    if compat.TORCH_VERSION != fixture["producer"]["torch"]:
        pytest.skip("the fixture was exported with torch %s" % fixture["producer"]["torch"])
    assert strip(doc) == strip(fixture)


@pytest.mark.parametrize("batch", [4, 16, 64])
def test_first_step_counts_state_once(batch):
    with open(FIXTURE + ".trace.json") as f:
        doc = json.load(f)
    steady = replay(doc, batch)["phases"]
    first = replay(doc, batch, first_step=True)["phases"]
    assert first["optimizer"] == _first_step_by_hand(batch)["optimizer"]
    for p in ("forward", "backward"):
        assert steady[p] - first[p] == PARAM_BYTES, p
    # a trace exported before the state was labelled (category temporary, no optimizer_state): the state is
    # recognised as what the first optimizer step allocates among the initial storages, the same peaks
    old = copy.deepcopy(doc)
    ids = set(old["first_step"]["optimizer_state"])
    old["first_step"]["optimizer_state"] = []
    for s in old["initial_storages"] + [a for e in old["first_step"]["optimizer_events"] for a in e["alloc"]]:
        if s["id"] in ids:
            s["category"] = "temporary"
    assert first_step_created(old) == ids
    assert replay(old, batch, first_step=True)["phases"] == first


@pytest.mark.skipif(not compat.fake_tensors_available(), reason="fake tensors need PyTorch 2.x")
def test_fake_export_labels_replaced_state_as_real():
    m = _module()
    real = build_trace(m.make_job, 4, optimizer=m.ReplaceMomentum, device="cpu")

    def fake_job(b, s, fm):
        from memplan_torch import harness
        return harness.to_fake(m.make_job(b, s), fm), None

    fake = build_trace(m.make_job, 4, optimizer=m.ReplaceMomentum, make_fake_job=fake_job)
    assert fake["first_step"]["optimizer_state"] == real["first_step"]["optimizer_state"]
    assert fake["initial_storages"] == real["initial_storages"]
    for b in (4, 64):
        assert replay(fake, b, first_step=True)["phases"] == replay(real, b, first_step=True)["phases"]
