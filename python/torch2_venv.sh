#!/bin/sh
# Makes (once) and checks the virtual environment with PyTorch 2.x from PyPI that the bridge's tests and the
# validation suite also run on, beside Debian's python3-torch 1.13. Prints the environment's python on stdout;
# everything else goes to stderr.
#
#   python/torch2_venv.sh            # -> /root/.cache/memplan/venv-torch2/bin/python
#   MEMPLAN_VENV=/some/dir python/torch2_venv.sh
#
# The environment lives outside the repository (default ${XDG_CACHE_HOME:-~/.cache}/memplan/venv-torch2), so
# every clone on the machine shares it: PyPI's Linux torch wheel is the CUDA build and pulls several GB of
# nvidia-* wheels (about 5 GB installed). It is reused while its python imports torch, torchvision, yaml and
# pytest and it was installed from the current python/requirements-torch2.txt and requirements-torch2-nodeps.txt
# (their hash is kept inside);
# otherwise it is (re)installed. A lock keeps two runs from installing into it at once.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REQ="$HERE/requirements-torch2.txt"
NODEPS="$HERE/requirements-torch2-nodeps.txt"  # installed with --no-deps after REQ (litgpt; see the file)
HOME=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
V=${MEMPLAN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/memplan/venv-torch2}
BASE=${MEMPLAN_VENV_BASE_PYTHON:-/usr/bin/python3}
PY="$V/bin/python"
STAMP="$V/.memplan-requirements.sha256"
want=$(cat "$REQ" "$NODEPS" | sha256sum | cut -d' ' -f1)

ready() {
    [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
        "$PY" -c 'import torch, torchvision, yaml, pytest' >/dev/null 2>&1
}

if ready; then
    echo "$PY"
    exit 0
fi

mkdir -p "$(dirname "$V")"
exec 9>"$V.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
    echo "torch2_venv: another run is installing into $V; waiting for it" >&2
    flock 9
fi
if ready; then  # another run installed it while this one waited
    echo "$PY"
    exit 0
fi

start=$(date +%s)
if ! "$BASE" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "torch2_venv: $BASE cannot make a virtual environment; installing python3-venv" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update >&2
    $SUDO apt-get install -y python3-venv >&2
fi
# An environment that is half-made, foreign or broken (an import fails) is made anew; a working one installed
# from an older requirements file is upgraded in place.
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' >/dev/null 2>&1 ||
        ! "$PY" -c 'import torch, torchvision, yaml, pytest' >/dev/null 2>&1; then
    echo "torch2_venv: creating $V with $BASE" >&2
    rm -rf "$V"
    "$BASE" -m venv "$V" >&2
fi
rm -f "$STAMP"
echo "torch2_venv: installing $(grep -E '^(torch|torchvision)==' "$REQ" | tr '\n' ' ')into $V (several GB, once)" >&2
tries=0
until "$PY" -m pip install --no-input --disable-pip-version-check --progress-bar off --no-cache-dir \
        --retries 10 --timeout 120 -r "$REQ" >&2; do
    tries=$((tries + 1))
    if [ "$tries" -ge 3 ]; then
        echo "torch2_venv: pip install failed $tries times; giving up" >&2
        exit 1
    fi
    echo "torch2_venv: pip install failed; retrying ($tries)" >&2
    sleep 10
done
if ! "$PY" -m pip install --no-input --disable-pip-version-check --progress-bar off --no-cache-dir \
        --retries 10 --timeout 120 --no-deps -r "$NODEPS" >&2; then
    echo "torch2_venv: pip install --no-deps -r $NODEPS failed" >&2
    exit 1
fi
if ! "$PY" -c 'import torch, torchvision, yaml, pytest' >&2; then
    echo "torch2_venv: installed, but the imports fail (above)" >&2
    exit 1
fi
echo "$want" >"$STAMP"
echo "torch2_venv: ready in $(($(date +%s) - start))s: $("$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)')" >&2
echo "$PY"
