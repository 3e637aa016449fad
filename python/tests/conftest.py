import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # python/
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import shutil
import subprocess

import pytest

REPO = os.path.dirname(ROOT)


@pytest.fixture(scope="session")
def memplan_bin(tmp_path_factory):
    """The Go CLI, built once per session; None where Go or the repository's Go sources are not here."""
    if shutil.which("go") is None or not os.path.exists(os.path.join(REPO, "go.mod")):
        return None
    out = str(tmp_path_factory.mktemp("bin") / "memplan")
    r = subprocess.run(["go", "build", "-o", out, "./cmd/memplan"], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    assert r.returncode == 0, r.stdout.decode()
    return out
