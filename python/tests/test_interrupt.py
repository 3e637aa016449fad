"""Issue 15 item 8: Ctrl-C while `python3 -m memplan_torch` is still importing torch printed a traceback; the command
answers it in one line with exit status 130, as it does once running."""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LINE = "error: memplan_torch: interrupted; nothing was written"


def _fake_torch(tmp_path):
    """A torch whose import is Ctrl-C'd: SIGINT to itself, then a wait the interrupt ends."""
    d = tmp_path / "fake" / "torch"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(60)\n")
    return str(tmp_path / "fake")


def _env(*front):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(list(front) + [ROOT, HERE]))
    env.pop("MEMPLAN_TORCH_TRACEBACK", None)
    return env


def test_ctrl_c_while_importing_torch(tmp_path):
    (tmp_path / "w.yaml").write_text("model: builders:wide_mlp\nbatch: 4\n")
    env = _env(_fake_torch(tmp_path))
    for args in (["measure", "w.yaml", "--out", "o.json"], ["export", "builders:wide_mlp", "--out", "t.json"]):
        r = subprocess.run([sys.executable, "-m", "memplan_torch"] + args, cwd=str(tmp_path), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=50)
        assert (r.returncode, r.stderr.decode().splitlines()) == (130, [LINE]), (args, r.stderr.decode())
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "t.json").exists()


def test_ctrl_c_while_a_program_imports_the_package_is_the_programs(tmp_path):
    """Imported by a program, the interrupt propagates as Python's KeyboardInterrupt (the program's to answer)."""
    r = subprocess.run([sys.executable, "-c", "import memplan_torch"], env=_env(_fake_torch(tmp_path)),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=50)
    assert r.returncode != 130 and "KeyboardInterrupt" in r.stderr.decode()


def test_ctrl_c_from_outside_during_the_real_import(tmp_path):
    """A real SIGINT as soon as the real torch's library is loaded: one line and 130, whether it lands in the import
    or in the export that follows it."""
    p = subprocess.Popen([sys.executable, "-m", "memplan_torch", "export", "builders:wide_mlp", "--out", "t.json"],
                         cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        try:
            with open("/proc/%d/maps" % p.pid) as f:
                if "libtorch" in f.read():
                    break
        except OSError:
            break
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err.decode().splitlines()) == (130, [LINE]), err.decode()
    assert not (tmp_path / "t.json").exists()
