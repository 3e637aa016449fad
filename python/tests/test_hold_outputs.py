"""How long the training loop keeps the model's output (issue 10, item 6; memplan's loop.hold-outputs): measured
on CPU under the allocation tracker for the three habits (workload hold_outputs) and predicted from one trace
(its model_output), by memplan_torch.replay and by `memplan plan --graph --workload`; `plan --graph` alone plans a
plain loop (`out = model(x); loss = f(out); loss.backward()`: held through backward)."""

import json
import subprocess

import pytest

from memplan_torch import measure
from memplan_torch.export import export_builder
from memplan_torch.replay import HOLDS, replay

BATCH = 64
LOGITS = BATCH * 2048 * 4


@pytest.fixture(scope="module")
def measured_and_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("hold")
    ws = [dict(name="hold_" + h, model="hold_builders:wide_head", batch=BATCH, device="cpu", warmup=1, iters=2,
               optimizer="adamw", foreach=False, hold_outputs=h) for h in HOLDS]
    doc = measure(ws)
    trace = export_builder("hold_builders:wide_head", str(d / "t.json"), batch=4, optimizer="adamw", device="cpu",
                           foreach=False)
    for w in ws:
        with open(str(d / (w["name"] + ".json")), "w") as f:
            json.dump(dict(w, schema="memplan.workload/v1"), f)
    return d, {c["name"][len("hold_"):]: c for c in doc["cases"]}, trace


def _close(got, want, what):
    for p in ("forward", "backward", "optimizer"):
        assert abs(got[p] - want[p]) <= 0.01 * want[p], (what, p, got[p], want[p])


def test_trace_records_model_output(measured_and_trace):
    _, _, trace = measured_and_trace
    mo = trace["model_output"]
    ev = trace["events"][mo["returned_at"]]
    assert ev["phase"] == "forward" and ev["module"] == "2" and ev["op"] == "aten.addmm.default"
    assert mo["storages"] == [a["id"] for a in ev["alloc"]]
    assert [a["bytes_per_batch"] for a in ev["alloc"]] == [2048 * 4]


def test_habits_measured_and_replayed(measured_and_trace):
    _, cases, trace = measured_and_trace
    for h in HOLDS:
        c = cases[h]
        _close(replay(trace, BATCH, min_bytes=1024, hold=h, scratch=True)["phases"], c["phases"], h)
        _close(replay(trace, BATCH, min_bytes=1024, hold=h, first_step=True, scratch=True)["phases"],
               c["first_step"]["phases"], h + " first step")
    # what the habits change, measured: backward holds the logits (a loop that drops them has freed them by
    # then); the next forward holds them through the optimizer step too (and into the next forward, whose peak is
    # in the loss here, after the variable is rebound)
    none, bwd, nxt = cases["none"]["phases"], cases["backward"]["phases"], cases["next-forward"]["phases"]
    assert bwd["backward"] - none["backward"] == LOGITS
    assert nxt["optimizer"] - none["optimizer"] == LOGITS
    assert nxt["backward"] - none["backward"] == LOGITS


def _plan(memplan, *args):
    r = subprocess.run([memplan, "plan", "--json", "--no-timeline"] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return {p: v["peak_bytes"] for p, v in json.loads(r.stdout)["phases"].items()}


def test_memplan_plans_the_habits(measured_and_trace, memplan_bin):
    if memplan_bin is None:
        pytest.skip("needs Go")
    d, cases, _ = measured_and_trace
    t = str(d / "t.json")
    for h in HOLDS:
        _close(_plan(memplan_bin, "--graph", t, "--workload", str(d / ("hold_%s.json" % h))), cases[h]["phases"], h)
    # without a workload: a plain loop's habit, through backward; --set and --recipe choose another
    base = ["--graph", t, "--micro-batch", str(BATCH), "--kernels", "cpu"]
    plain = _plan(memplan_bin, *base)
    assert plain == _plan(memplan_bin, *(base + ["--set", "loop.hold-outputs=backward"]))
    none = _plan(memplan_bin, *(base + ["--set", "loop.hold-outputs=false"]))
    assert plain["backward"] - none["backward"] == LOGITS
    assert none == _plan(memplan_bin, *(base + ["--recipe", "hf"]))
    nxt = _plan(memplan_bin, *(base + ["--recipe", "pytorch"]))
    assert nxt["optimizer"] - none["optimizer"] == LOGITS


@pytest.mark.parametrize("change, msg", [
    (lambda mo: mo.update(returned_at=10 ** 6), "returned_at 1000000 is not the index of a forward event"),
    (lambda mo: mo.update(returned_at="4"), "returned_at"),
    (lambda mo: mo.update(storages=[0]), "storage 0 is not allocated by the forward"),
    (lambda mo: mo.update(hold="always"), "hold 'always' is not none, backward or next-forward"),
    (lambda mo: mo.pop("storages"), "storages"),
])
def test_model_output_bad_input(measured_and_trace, change, msg):
    import copy
    from memplan_torch.schema import SchemaError, validate_trace
    _, _, trace = measured_and_trace
    validate_trace(trace)
    doc = copy.deepcopy(trace)
    change(doc["model_output"])
    with pytest.raises(SchemaError, match=msg):
        validate_trace(doc)
    with pytest.raises(ValueError, match="re-export"):
        replay({k: v for k, v in trace.items() if k != "model_output"}, BATCH, hold="backward")
    with pytest.raises(ValueError, match="hold must be one of"):
        replay(trace, BATCH, hold="always")


def test_workload_hold_outputs_bad_input():
    from memplan_torch.workload import WorkloadError, validate
    w = dict(model="hold_builders:wide_head", batch=4)
    assert validate(dict(w))["hold_outputs"] == "none"
    with pytest.raises(WorkloadError, match="field 'hold_outputs' must be one of none, backward, next-forward"):
        validate(dict(w, hold_outputs="always"))
    with pytest.raises(WorkloadError, match="field 'hold_outputs' must be a string"):
        validate(dict(w, hold_outputs=True))
