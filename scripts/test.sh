#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need when
# it is missing, then checks formatting, vets, runs the Go tests (with the race
# detector off to stay inside CI's time) and the PyTorch bridge's tests and the validation suite, on Debian's
# PyTorch 1.13 and on PyTorch 2.x from PyPI (a virtual environment outside the repository, made on the first
# run and reused by every clone on the machine: python/torch2_venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/local/go/bin:$PATH"
if ! command -v go >/dev/null 2>&1; then
  echo "test.sh: Go is not installed (need Go >= 1.26)" >&2
  exit 1
fi

# Each section says when it starts (seconds since this script started).
section() { echo "== $* [${SECONDS}s]"; }

section gofmt
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then
  echo "gofmt would change:" >&2
  echo "$bad" >&2
  exit 1
fi

section go vet
go vet ./...

section go test
go test -count=1 -skip '^TestProbes$' ./...

# Issue 15's adversarial corpus (cmd/memplan TestProbes: every probe as a built binary, each under 10 s and 2 GiB)
# on its own, after the other packages: its bounds are the probes' time on the machine, which the other packages'
# tests, run beside it, would take half of.
section "issue 15's probes, alone (go test -run TestProbes ./cmd/memplan)"
go test -count=1 -run '^TestProbes$' -v ./cmd/memplan

# The scheduler plugin is its own module (it builds k8s.io/kubernetes' scheduler, which the main module does not
# pull): vet and test it inside the scheduler framework. MEMPLAN_K8S_PLUGIN=0 skips it.
if [ "${MEMPLAN_K8S_PLUGIN:-1}" != 0 ]; then
  section "k8s/plugin module: MemplanGPU in the scheduler framework, and the kube-scheduler binary builds"
  (cd k8s/plugin && go vet ./... && go test -count=1 ./... && go build -o /dev/null ./cmd/kube-scheduler)
fi

section "memplan serve load test, short (cmd/loadtest: 50 clients for 5 s; fails on an error, not on latency, which the host decides)"
go run ./cmd/loadtest --clients 50 --duration 5s --new-rate 1 --check-errors > /dev/null

# The web page in headless Chromium (web/e2e/run.sh installs Debian's chromium and `npm ci`s playwright-core when
# missing; 26-43 s here with both installed, about 18 s of it building memplan). MEMPLAN_WEB_E2E=0 skips it.
if [ "${MEMPLAN_WEB_E2E:-1}" != 0 ]; then
  section "web page end to end in headless Chromium (web/e2e: the numbers shown equal the API's, re-plan, explain, pack)"
  web/e2e/run.sh
fi

section "python (memplan_torch) on Debian's PyTorch 1.13: installs it when missing"
python/run_tests.sh

section "validation suite on torch 1.13: measure real CPU runs, predict each from its trace, compare"
scripts/validate.sh --tolerance 3%

# PyTorch 2.x from PyPI, in a virtual environment outside the repository that python/torch2_venv.sh makes on
# the first run (about 4 minutes, 5.5 GB) and every later run and clone on the machine reuses.
# MEMPLAN_TORCH2=0 skips these runs.
if [ "${MEMPLAN_TORCH2:-1}" != 0 ]; then
  section "PyTorch 2.x venv (python/torch2_venv.sh)"
  python/torch2_venv.sh >/dev/null

  section "python (memplan_torch) on PyTorch 2.x, with the framework suite (HF Trainer + peft, litgpt, torchtune)"
  fw=$(mktemp -d "${TMPDIR:-/tmp}/memplan-frameworks.XXXXXX")
  rc=0
  MEMPLAN_FRAMEWORKS_OUT="$fw" python/run_tests.sh --torch2 || rc=$?
  if [ -f "$fw/table.md" ]; then
    echo "framework suite: one training step each on CPU, measured vs memplan (python/memplan_torch/frameworks.py)"
    cat "$fw/table.md"
  fi
  [ "$rc" = 0 ] || exit "$rc"

  section "validation suite on PyTorch 2.x: the same cases, the same tolerance"
  scripts/validate.sh --torch2 --tolerance 3%

  section "exporter scaling on PyTorch 2.x (issue 15): a 400-layer linear stack in under 10x the time of 50 layers"
  "$(python/torch2_venv.sh)" python/bench_export_scaling.py --layers 50,400
fi
# Last, so a failure here does not hide the results above: issue 14's limits on function size.
section "function size (scripts/funcsize: no function over 120 lines or complexity 40, p90 length <= 40)"
go run ./scripts/funcsize

echo "test.sh: all passed in ${SECONDS}s"
