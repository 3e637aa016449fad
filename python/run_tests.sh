#!/bin/sh
# Runs memplan_torch's tests with Debian's PyTorch (/usr/bin/python3), installing it when missing.
# Usage: python/run_tests.sh [pytest args]   (from any directory)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
if ! "$PY" -c 'import torch, torchvision, yaml, pytest' >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update
    $SUDO apt-get install -y python3-torch python3-torchvision python3-yaml python3-pytest gcc
fi
cd "$HERE/.."
exec "$PY" -m pytest -q python/tests "$@"
