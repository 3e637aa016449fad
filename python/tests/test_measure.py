import json
import os
import subprocess
import sys

import pytest

from memplan_torch import MeasureError, measure
from memplan_torch.export import export_builder
from memplan_torch.replay import replay
from memplan_torch.schema import validate_measured

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def test_measure_cpu_matches_trace_replay(tmp_path):
    # wide MLP: every tensor that matters is >= 1 KiB, no in-kernel scratch; SGD with momentum
    w = {"name": "mlp", "model": "builders:wide_mlp", "batch": 64, "device": "cpu", "warmup": 1, "iters": 2,
         "optimizer": "sgd-momentum"}
    doc = measure([w], out=str(tmp_path / "m.json"))
    assert json.loads((tmp_path / "m.json").read_text())["schema"] == "memplan.measured/v1"
    validate_measured(doc)
    c = doc["cases"][0]
    assert c["device"] == "cpu" and c["memory"]["kind"] == "memtrack" and c["memory"]["threshold_bytes"] == 1024
    # live at step start: parameters + momentum buffers + inputs; the last bias (64 B) and the targets
    # (512 B) are under the 1 KiB threshold
    params = c["param_bytes"] - 16 * 4
    assert c["baseline_bytes"] == 2 * params + 64 * 256 * 4
    # first step starts without momentum buffers
    assert c["first_step"]["baseline_bytes"] == params + 64 * 256 * 4
    trace = export_builder("builders:wide_mlp", str(tmp_path / "t.json"), batch=4, optimizer="sgd-momentum",
                           device="cpu")
    r = replay(trace, 64, min_bytes=1024)
    for p in ("forward", "backward", "optimizer"):
        assert abs(r["phases"][p] - c["phases"][p]) <= 0.01 * c["phases"][p], (p, r["phases"][p], c["phases"][p])
    rf = replay(trace, 64, first_step=True, min_bytes=1024)
    assert rf["baseline_bytes"] == c["first_step"]["baseline_bytes"]


def test_measure_cli_reports_bad_workload(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("model: builders:wide_mlp\nbatch: 4\noptimiser: sgd\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "measure", str(p), "--out", str(tmp_path / "o.json")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 1
    assert "unknown field 'optimiser'" in r.stdout.decode()
    assert not (tmp_path / "o.json").exists()


def test_measure_cli_strategies(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("model: memplan_torch.models:transformer_lm\nbatch: 4\nseq_len: 16\ndevice: cpu\nwarmup: 0\n"
                 "iters: 1\nmodel_args: {layers: 2}\nstrategy: {checkpoint: blocks, accumulation: 2}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    out = tmp_path / "o.json"
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "measure", str(p), "--out", str(out)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 0, r.stdout.decode()
    c = json.loads(out.read_text())["cases"][0]
    assert c["strategy"]["checkpoint_blocks"] == "layers" and c["strategy"]["checkpoint_count"] == 2
    assert c["strategy"]["checkpoint_mode"] in ("non-reentrant", "reentrant")
    assert c["micro_batch"] == 2 and c["peak_bytes"] > c["baseline_bytes"] > 0


def test_measure_keeps_the_cases_that_succeed(tmp_path):
    """Issue 15 item 9: one failing case discarded the others' results. The command writes the cases that
    succeeded, names the failed one in one line and exits 1; measure() writes them too, then raises."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("model: builders:wide_mlp\nbatch: 4\ndevice: cpu\nwarmup: 0\niters: 1\n")
    bad.write_text("model: builders:no_such_builder\nbatch: 4\ndevice: cpu\nwarmup: 0\niters: 1\n")
    out = tmp_path / "o.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    env.pop("MEMPLAN_TORCH_TRACEBACK", None)
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "measure", str(bad), str(good), "--out", str(out)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert err.splitlines()[-2:] == [
        "error: memplan_torch: measure: case no_such_builder (%s) failed: memplan_torch: module 'builders' has no "
        "function 'no_such_builder' (builder 'builders:no_such_builder')" % bad,
        "error: memplan_torch: measure: 1 of 2 cases failed; wrote the other 1 to %s" % out], err
    assert "Traceback" not in err
    with open(str(out)) as f:
        assert [c["name"] for c in json.load(f)["cases"]] == ["wide_mlp"]
    out.unlink()
    with pytest.raises(MeasureError, match="case no_such_builder .* 1 of 2 cases failed") as e:
        measure([str(bad), str(good)], out=str(out))
    # One line, naming the files as given (a child process measures temporary copies of them on CPU).
    assert "\n" not in str(e.value) and str(bad) in str(e.value), str(e.value)
    with open(str(out)) as f:
        assert [c["name"] for c in json.load(f)["cases"]] == ["wide_mlp"]
