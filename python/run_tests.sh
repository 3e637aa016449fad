#!/bin/sh
# Runs memplan_torch's tests, by default with Debian's PyTorch 1.13 (/usr/bin/python3, installed when missing).
# Usage: python/run_tests.sh [--torch2 | --python PATH] [pytest args]   (from any directory)
#   --torch2       PyTorch 2.x from PyPI in the shared virtual environment python/torch2_venv.sh makes (once)
#   --python PATH  any python that imports torch, torchvision, yaml and pytest
# pytest's exit status 5 (no test collected) is an error here: it means the tests were not found.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
debian=1
case "${1:-}" in
    --torch2) PY=$("$HERE/torch2_venv.sh"); debian=0; shift ;;
    --python) PY=$2; debian=0; shift 2 ;;
esac
if [ "$debian" = 1 ]; then
    if ! "$PY" -c 'import torch, torchvision, yaml, pytest' >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
        SUDO=""
        if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
        $SUDO apt-get update
        $SUDO apt-get install -y python3-torch python3-torchvision python3-yaml python3-pytest gcc
    fi
else
    if ! "$PY" -c 'import torch, torchvision, yaml, pytest' >/dev/null 2>&1; then
        echo "run_tests.sh: $PY does not import torch, torchvision, yaml and pytest" >&2
        exit 1
    fi
    if ! command -v cc >/dev/null 2>&1; then  # the CPU tracker is compiled with it
        SUDO=""
        if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
        $SUDO apt-get update
        $SUDO apt-get install -y gcc
    fi
fi
cd "$HERE/.."
echo "run_tests.sh: $("$PY" -c 'import sys, torch; print("torch", torch.__version__, "on python", sys.version.split()[0], "(" + sys.executable + ")")')"
rc=0
"$PY" -m pytest -q python/tests "$@" || rc=$?
if [ "$rc" = 5 ]; then
    echo "run_tests.sh: pytest collected no tests (exit 5); the bridge's tests were not found" >&2
    exit 1
fi
exit "$rc"
