"""Issue 15 (item 3, 5): the exporter's command line refuses bad input in one line, exit 1, nothing written and
nothing left behind; outputs are written atomically (symbolic links written through, pipes and directories
refused, the temporary file removed on a signal)."""

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from memplan_torch import atomic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    env.pop("MEMPLAN_TORCH_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "memplan_torch"] + args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)


BAD = [
    # arguments (after `export builders:wide_mlp --device meta`), what the one line says
    (["--out", "t.json", "--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["--out", "t.json", "--batch", "-3"], "argument --batch: must be at least 1, got -3"),
    (["--out", "t.json", "--batch", "two"], "argument --batch: want a whole number, got 'two'"),
    (["--out", "t.json", "--seq-len", "0", "--seq-dim", "1"], "argument --seq-len: must be at least 1, got 0"),
    (["--out", "t.json", "--seq-dim", "1"], "--seq-dim needs --seq-len"),
    (["--out", "t.json", "--batch-dim", "-1"], "argument --batch-dim: must be at least 0, got -1"),
    (["--out", "t.json", "--optimizer", "adam9"], "unknown optimizer 'adam9'"),
    (["--batch", "2"], "the following arguments are required: --out"),
    (["--out", "sub"], "is a directory"),
    (["--out", "fifo"], "is a named pipe"),
    (["--out", "file/t.json"], "Not a directory"),
    (["--out", ""], "--out needs a file path"),
    (["--out", "loop"], "symbolic link that loops"),
    # no folder is made for the output (as memplan fit --emit-out): nodir is not created
    (["--out", "nodir/t.json"], "--out nodir/t.json: its directory"),
    (["--out", "nodir/deeper/t.json"], "does not exist"),
    # a dimension no input has (wide_mlp's input is [batch, 256]): refused, not fitted as a constant
    (["--out", "t.json", "--batch-dim", "9"], "--batch-dim 9 is out of range for the model's inputs (rank 2"),
    (["--out", "t.json", "--batch-dim", "2"], "--batch-dim 2 is out of range for the model's inputs (rank 2"),
    (["--out", "fifolink"], "is a named pipe (through the symbolic link"),
    # sweep G, round 25: ASCII decimal digits only, as memplan's flags (int() took these), and memplan's bound of
    # 2^34 tokens per micro-step before torch runs (--batch 10^30 gave torch's C++ backtrace)
    (["--out", "t.json", "--batch", "1_0"], "argument --batch: want a whole number, got '1_0'"),
    (["--out", "t.json", "--batch", "\u0663"], "argument --batch: want a whole number, got"),
    (["--out", "t.json", "--batch", "\uff12"], "argument --batch: want a whole number, got"),
    (["--out", "t.json", "--batch", " 2 "], "argument --batch: want a whole number, got ' 2 '"),
    (["--out", "t.json", "--batch-dim", "\uff11"], "argument --batch-dim: want a whole number, got"),
    (["--out", "t.json", "--batch", "1" + "0" * 30], "argument --batch: must be at most 17179869184"),
    (["--out", "t.json", "--seq-len", "17179869185"], "argument --seq-len: must be at most 17179869184"),
    (["--out", "t.json", "--batch", "65536", "--seq-len", "262145"], "over memplan's limit of 2^34 tokens"),
    # a trailing slash names a directory: abspath dropped it and a file named newdir was written
    (["--out", "newdir/"], "--out newdir/ ends in '/'"),
    (["--out", "t.json/"], "--out t.json/ ends in '/'"),
    # an argument quoted in argparse's error stays on one line
    (["--out", "t.json", "--bogus", "a\nb"], "unrecognized arguments: --bogus a\\nb"),
]


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "sub").mkdir()
    os.mkfifo(str(tmp_path / "fifo"))
    (tmp_path / "file").write_text("x")
    os.symlink("loop2", str(tmp_path / "loop"))
    os.symlink("loop", str(tmp_path / "loop2"))
    os.symlink("fifo", str(tmp_path / "fifolink"))
    return tmp_path


def _main(args, cwd, capsys, monkeypatch):
    """memplan_torch's main() in this process (python -m memplan_torch runs it; importing torch per case in a
    subprocess would cost seconds each): (exit status, stderr)."""
    from memplan_torch.__main__ import main
    monkeypatch.chdir(str(cwd))
    monkeypatch.delenv("MEMPLAN_TORCH_TRACEBACK", raising=False)
    try:
        rc = main(args)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("args,want", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_export_cli_bad_input(workdir, args, want, capsys, monkeypatch):
    before = sorted(os.listdir(str(workdir)))
    rc, err = _main(["export", "builders:wide_mlp", "--device", "meta"] + args, workdir, capsys, monkeypatch)
    assert rc == 1, (rc, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert want in err, err
    assert sorted(os.listdir(str(workdir))) == before  # nothing written, no temporary file


@pytest.mark.parametrize("args,want", [
    (["export", "no_such_module_zz:build", "--out", "t.json"], "cannot import module 'no_such_module_zz'"),
    (["export", "builders:wide_mlp"], "the following arguments are required: --out"),
    (["suite", "--out", "file"], "suite --out file is not a directory"),
    (["measure", "w.yaml", "--out", "sub"], "is a directory"),
    (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
    (["measure", "w.yaml", "--out", "nodir/m.json"], "--out nodir/m.json: its directory"),
    (["export-hf", "gpt2", "--seq", "16", "--out", "nodir/t.json"], "--out nodir/t.json: its directory"),
    (["export", "memplan_torch.models:transformer_lm", "--device", "meta", "--out", "t.json", "--seq-len", "8",
      "--seq-dim", "7"], "--seq-dim 7 is out of range for the model's inputs (rank 2"),
    (["export", "memplan_torch.models:transformer_lm", "--device", "meta", "--out", "t.json", "--seq-len", "8",
      "--seq-dim", "1", "--batch-dim", "5"], "--batch-dim 5 is out of range for the model's inputs (rank 2"),
    # sweep G, round 25: a builder's SystemExit is not an Exception; it ended the exporter with status 3, silently
    (["export", "builders:exits_3", "--device", "meta", "--out", "t.json"],
     "the builder builders:exits_3 exited (SystemExit(3))"),
])
def test_cli_bad_input_other_commands(workdir, args, want, capsys, monkeypatch):
    before = sorted(os.listdir(str(workdir)))
    rc, err = _main(args, workdir, capsys, monkeypatch)
    assert rc == 1 and err.count("\n") == 1 and want in err, (rc, err)
    assert sorted(os.listdir(str(workdir))) == before  # nothing written, no folder made


def test_suite_missing_parent_directory(workdir):
    """suite makes its --out folder, not the folders above it (a subprocess: suite re-executes itself under the
    CPU tracker)."""
    r = _run(["suite", "--out", "nodir/sub"], str(workdir))
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1 and "--out nodir/sub: its directory" in err, err
    assert not os.path.exists(str(workdir / "nodir"))


def test_missing_directory_is_refused_by_the_library(tmp_path):
    with pytest.raises(atomic.OutputError) as ei:
        atomic.write_json({}, str(tmp_path / "no" / "such" / "o.json"))
    assert "its directory" in str(ei.value) and "does not exist" in str(ei.value)
    assert os.listdir(str(tmp_path)) == []


def test_symlink_is_written_through(workdir):
    os.symlink("real.json", str(workdir / "link.json"))
    r = _run(["export", "builders:wide_mlp", "--device", "meta", "--out", "link.json"], str(workdir))
    assert r.returncode == 0, r.stderr.decode()
    assert os.path.islink(str(workdir / "link.json"))
    assert json.loads((workdir / "real.json").read_text())["schema"] == "memplan.trace/v2"
    assert not [p for p in os.listdir(str(workdir)) if p.startswith(".tmp")]


def test_signal_while_writing_leaves_nothing(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old\n")

    def fill(f):
        f.write("{\"partial\": ")
        f.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        f.write("1}\n")  # not reached

    old = signal.getsignal(signal.SIGTERM)
    with pytest.raises(atomic.Interrupted) as ei:
        atomic.write(str(path), fill)
    assert ei.value.signum == signal.SIGTERM
    assert path.read_text() == "old\n"  # the previous file is untouched
    assert os.listdir(str(tmp_path)) == ["out.json"]  # the temporary file is gone
    assert signal.getsignal(signal.SIGTERM) == old  # the handler is restored


def test_write_error_is_output_error(tmp_path):
    def fill(f):
        raise OSError(28, "No space left on device")
    with pytest.raises(atomic.OutputError) as ei:
        atomic.write(str(tmp_path / "o.json"), fill)
    assert "No space left on device" in str(ei.value) and "--out" in str(ei.value)
    assert os.listdir(str(tmp_path)) == []


def test_long_extension_fits_the_temporary_name(tmp_path):
    """Sweep G, round 25: a legal 255-byte name was refused only when written (after the whole export): its
    temporary name, .tmp-XXXXXXXX plus the target's extension, went past NAME_MAX."""
    name = "a." + "x" * 253
    atomic.write_json({"ok": 1}, str(tmp_path / name))
    assert json.loads((tmp_path / name).read_text()) == {"ok": 1}
    assert os.listdir(str(tmp_path)) == [name]


@pytest.mark.parametrize("signame", ["SIGUSR1", "SIGALRM", "SIGQUIT"])
def test_other_ending_signals_leave_nothing(tmp_path, signame):
    """Sweep G, round 25: SIGUSR1, SIGALRM and SIGQUIT left the temporary file behind."""
    sig = getattr(signal, signame)
    path = tmp_path / "out.json"

    def fill(f):
        f.write("{")
        f.flush()
        os.kill(os.getpid(), sig)

    old = signal.getsignal(sig)
    with pytest.raises(atomic.Interrupted) as ei:
        atomic.write(str(path), fill)
    assert ei.value.signum == sig and os.listdir(str(tmp_path)) == []
    assert signal.getsignal(sig) == old


def test_an_ignored_signal_stays_ignored(tmp_path):
    """A SIGHUP the caller ignores (nohup) is not armed while writing (sweep G, round 25: it was, and a hangup
    lost the export)."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        def fill(f):
            os.kill(os.getpid(), signal.SIGHUP)
            f.write("{}\n")
        atomic.write(str(tmp_path / "o.json"), fill)
        assert (tmp_path / "o.json").read_text() == "{}\n"
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_written_file_keeps_the_mode_it_replaces(tmp_path):
    """The written file keeps the replaced file's mode, and a new one gets 0666 less the umask (sweep G, round
    25: every output was 0644)."""
    old = tmp_path / "old.json"
    old.write_text("x\n")
    os.chmod(str(old), 0o600)
    atomic.write_json({}, str(old))
    assert stat.S_IMODE(os.stat(str(old)).st_mode) == 0o600
    umask = os.umask(0o027)
    try:
        atomic.write_json({}, str(tmp_path / "new.json"))
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(str(tmp_path / "new.json")).st_mode) == 0o640
