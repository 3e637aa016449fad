#!/usr/bin/env bash
# The validation suite: measures every case for real (python/memplan_torch suite: traces at a small batch,
# measurements at a larger one), then predicts each from its trace and compares per-phase peaks:
#
#   scripts/validate.sh                      # CPU, LD_PRELOAD allocation tracker (what CI runs)
#   scripts/validate.sh --device cuda        # GPU: max_memory_allocated per phase (under 8 minutes)
#   scripts/validate.sh --out DIR --tolerance 3%
#   scripts/validate.sh --torch2             # on PyTorch 2.x from PyPI (python/torch2_venv.sh makes its venv once)
#   scripts/validate.sh --python PATH        # on any python that imports torch, torchvision and yaml
#   scripts/validate.sh --cases a,b          # only these cases (python -m memplan_torch suite --cases)
#   scripts/validate.sh --heavy              # torchvision's ViT-B/16 and Swin-T exported at batch 1, measured
#                                            # at 1, 2 and 8 (not in CI: about 25 minutes and 6 GiB on 2 cores)
#
# Exit status 1 when any phase peak is beyond the tolerance or a peak phase is wrong.
set -euo pipefail
cd "$(dirname "$0")/.."

device=cpu
out=""
cases=""
tolerance=3%
PY=/usr/bin/python3
debian=1
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tolerance) tolerance=$2; shift 2 ;;
    --python) PY=$2; debian=0; shift 2 ;;
    --torch2) PY=$(python/torch2_venv.sh); debian=0; shift ;;
    --cases) cases=$2; shift 2 ;;
    --heavy) cases=vit_b_16_b1,vit_b_16_b2,vit_b_16_b8,swin_t_b1,swin_t_b2,swin_t_b8; shift ;;
    *) echo "validate.sh: unknown argument $1 (want --device cpu|cuda, --out DIR, --tolerance 3%, --python PATH, --torch2, --cases A,B, --heavy)" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/memplan-validate.XXXXXX")
fi
export PATH="/usr/local/go/bin:$PATH"
if [ "$debian" = 1 ]; then
  if ! "$PY" -c 'import torch, torchvision, yaml' >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update
    $SUDO apt-get install -y python3-torch python3-torchvision python3-yaml gcc
  fi
else
  if ! "$PY" -c 'import torch, torchvision, yaml' >/dev/null 2>&1; then
    echo "validate.sh: $PY does not import torch, torchvision and yaml" >&2
    exit 1
  fi
  if ! command -v cc >/dev/null 2>&1; then  # the CPU tracker is compiled with it
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update
    $SUDO apt-get install -y gcc
  fi
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "== suite ($device, $("$PY" -c 'import torch; print("torch", torch.__version__)')) -> $out"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m memplan_torch suite --out "$out" --device "$device" ${cases:+--cases "$cases"}
echo "== memplan validate"
go run ./cmd/memplan validate "$out/measured.json" --traces "$out" --tolerance "$tolerance"
