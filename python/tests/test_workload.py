import json
import os

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
    ({"batch": "8"}, "field 'batch' must be an integer, got a string"),
    ({"batch": 8.0}, "field 'batch' must be an integer, got a float"),
    ({"batch": 2 ** 70}, "field 'batch' must be <= 16777216, got 1180591620717411303424"),
    ({"optimizer": "adam"}, "field 'optimizer' must be one of adamw, sgd, sgd-momentum, got \"adam\""),
    ({"dtype": "int8"}, "field 'dtype'"),
    ({"strategy": {"checkpointing": "blocks"}}, "strategy: unknown field 'checkpointing'"),
    ({"strategy": {"accumulation": 3}}, "must be divisible by 'strategy.accumulation' (3)"),
    ({"strategy": {"offload": "weights"}}, "field 'strategy.offload' must be one of none, activations"),
    ({"model": "nocolon"}, "field 'model' must be MODULE:FUNCTION"),
    ({"device": "tpu"}, "field 'device' must be one of"),
    ({"iters": True}, "field 'iters' must be an integer, got a boolean"),
    ({"strategy": {"accumulation": "2"}}, "field 'strategy.accumulation' must be an integer, got a string"),
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


ODD = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "workload", "odd")


def _odd_cases():
    with open(os.path.join(ODD, "expect.json")) as f:
        want = json.load(f)
    names = sorted(n for n in os.listdir(ODD) if n.endswith(".yaml"))
    assert sorted(want) == names, "testdata/workload/odd/expect.json must name every .yaml there, and only those"
    return [(n, want[n]) for n in names]


@pytest.mark.parametrize("name,want", _odd_cases())
def test_odd_corpus(name, want):
    """The odd YAML corpus the Go reader's TestOddCorpus runs too: same expectations, so the readers agree."""
    pytest.importorskip("yaml")
    path = os.path.join(ODD, name)
    if "refuse" in want:
        with pytest.raises(WorkloadError) as ei:
            load(path)
        msg = str(ei.value)
        assert msg.startswith(name + ": ") and want["refuse"] in msg and "\n" not in msg, msg
        return
    w = load(path)
    for k, v in want["accept"].items():
        assert w[k] == v, (k, w[k], v)


def test_optimizers_are_the_harness_ones():
    """The table's optimizer choices are the ones the harness builds."""
    from memplan_torch import harness, workload
    assert tuple(harness.OPTIMIZERS) == workload.OPTIMIZERS


def test_load_refuses_bad_bytes(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_bytes(b"model: m:f\nbatch: \xff\n")
    with pytest.raises(WorkloadError, match="w.yaml: is not UTF-8 text"):
        load(str(p))
    p.write_bytes(b"#" * (1 << 20 + 1))
    with pytest.raises(WorkloadError, match="over the limit of 1048576 bytes"):
        load(str(p))


def test_json_duplicates_and_constants(tmp_path):
    p = tmp_path / "w.json"
    p.write_text('{"model": "m:f", "batch": 2, "batch": 4}')
    with pytest.raises(WorkloadError, match="field 'batch' is given twice"):
        load(str(p))
    # JSON is read as YAML, as the Go reader reads it: NaN is a plain string there
    p.write_text('{"model": "m:f", "batch": NaN}')
    with pytest.raises(WorkloadError, match="field 'batch' must be an integer, got a string"):
        load(str(p))


def test_refusals_quoting_line_breaks_stay_one_line(tmp_path):
    """Every path that quotes the file's text (a JSON key given twice, an unknown key, a value) writes its line
    breaks as \\n and \\r, as the Go reader does (the YAML cases are in the odd corpus)."""
    p = tmp_path / "w.json"
    for text, want in [('{"model": "m:f", "batch": 2, "a\\nb": 2, "a\\nb": 4}', "field 'a\\nb' is given twice"),
                       ('{"model": "m:f", "batch": 2, "x\\r\\ny": 2}', "unknown field 'x\\r\\ny'"),
                       ('{"model": "m\\nf", "batch": 2}', 'got "m\\nf"')]:
        p.write_text(text)
        with pytest.raises(WorkloadError) as ei:
            load(str(p))
        msg = str(ei.value)
        assert "\n" not in msg and "\r" not in msg and want in msg, msg


def test_load_refuses_what_is_not_a_regular_file(tmp_path):
    """Sweep G, round 25 (A12): a named pipe blocked the reader and /dev/zero was read; both are refused at once in
    the Go reader's words (internal/boundedio). A subprocess, so a reader that blocks fails the test."""
    import subprocess
    import sys
    os.mkfifo(str(tmp_path / "w.yaml"))
    code = ("import sys\nfrom memplan_torch.workload import load, WorkloadError\nfor p in sys.argv[1:]:\n"
            "    try:\n        load(p)\n    except WorkloadError as e:\n        print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "w.yaml"), "/dev/zero", str(tmp_path)],
                       stdout=subprocess.PIPE, timeout=60, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.stdout.decode().splitlines() == [
        "cannot read %s: not a regular file (a named pipe)" % (tmp_path / "w.yaml"),
        "cannot read /dev/zero: not a regular file (a device)",
        "cannot read %s: not a regular file (a directory)" % tmp_path]


@pytest.mark.parametrize("name,text,want", [
    # A8: a .json file takes the YAML path, with the table's depth, count and finiteness rules
    ("deep.json", '{"model": "m:f", "batch": 2, "model_args": {"x": ' + "[" * 40 + "]" * 40 + "}}",
     "deep.json: field 'model_args.x' nests deeper than 32 levels"),
    ("inf.json", '{"model": "m:f", "batch": 2, "model_args": {"x": 1e400}}',
     "inf.json: field 'model_args.x' must be a finite number, got 1e400"),
    ("many.json", '{"model": "m:f", "batch": 2, "model_args": {"x": [' + ",".join(["1"] * 20000) + "]}}",
     "many.json: the document expands to over 10000 values"),
    # A9: PyYAML composes recursively; 1,000 levels raised RecursionError before the depth check
    ("deep.yaml", "model: m:f\nbatch: 2\nmodel_args:\n  x: " + "[" * 1000 + "]" * 1000 + "\n",
     "deep.yaml: the document nests deeper than 32 levels"),
    # A10: int() refuses strings of over 4,300 digits with a ValueError; such integers are range errors, in the Go
    # reader's words (issue 15 item 6.5: Go accepted them in model_args)
    ("big.yaml", "model: m:f\nbatch: " + "9" * 4301 + "\n",
     "big.yaml: field 'batch' must be <= 16777216, got 99999999999999999999... (4301 digits)"),
    ("bigarg.yaml", "model: m:f\nbatch: 2\nmodel_args:\n  x: " + "9" * 5000 + "\n",
     "bigarg.yaml: field 'model_args.x' must be <= 9223372036854775807, got 99999999999999999999... (5000 digits)"),
])
def test_json_and_deep_files_take_the_yaml_rules(tmp_path, name, text, want):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(WorkloadError) as ei:
        load(str(p))
    assert want in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
