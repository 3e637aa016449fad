#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need when
# it is missing, then checks formatting, vets, runs the Go tests (with the race
# detector off to stay inside CI's time) and the PyTorch bridge's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/local/go/bin:$PATH"
if ! command -v go >/dev/null 2>&1; then
  echo "test.sh: Go is not installed (need Go >= 1.26)" >&2
  exit 1
fi

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then
  echo "gofmt would change:" >&2
  echo "$bad" >&2
  exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test"
go test -count=1 ./...

echo "== python (memplan_torch): installs Debian's PyTorch when missing"
python/run_tests.sh

echo "== validation suite: measure real CPU runs, predict each from its trace, compare"
scripts/validate.sh --tolerance 3%
