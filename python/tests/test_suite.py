import json
import os
import subprocess
import sys

from memplan_torch.schema import validate_measured, validate_trace

HERE = os.path.dirname(os.path.abspath(__file__))


def test_suite_subset(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "suite", "--out", str(tmp_path), "--device", "cpu",
                        "--cases", "gru,lm_accum4", "--iters", "1"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    assert r.returncode == 0, r.stdout.decode()
    doc = json.loads((tmp_path / "measured.json").read_text())
    assert validate_measured(doc) == 2
    for name in ("gru", "lm"):
        validate_trace(json.loads((tmp_path / (name + ".trace.json")).read_text()))
    gru = [c for c in doc["cases"] if c["name"] == "gru"][0]
    for p, err in gru["trace_replay"]["error_vs_measured"].items():
        assert abs(err) < 0.02, (p, err)
    assert (tmp_path / "workloads" / "lm_accum4.yaml").exists()
