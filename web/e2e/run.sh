#!/usr/bin/env bash
# The web page's end-to-end test (page.test.mjs) from a fresh machine: installs Debian's chromium with apt-get
# (sudo when not root) and playwright-core with `npm ci` (package-lock.json) when missing, builds memplan, runs
# the test. SCREENSHOT=docs/page.png (relative to the repository) refreshes the README's screenshot.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

if ! command -v node >/dev/null 2>&1 || ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)'; then
  echo "web/e2e: Node.js >= 20 is needed (playwright-core 1.65's engines); found: $(node --version 2>/dev/null || echo none)" >&2
  exit 1
fi

chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "web/e2e: installing Debian's chromium (apt-get)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

# npm ci when node_modules is missing or was installed from another lock file.
if ! cmp -s package-lock.json node_modules/.package-lock.json 2>/dev/null &&
  ! node -e 'const a=require("./package-lock.json").packages, b=require("./node_modules/.package-lock.json").packages;
             for (const k of Object.keys(a)) if (k && (!b[k] || b[k].version !== a[k].version)) process.exit(1)' 2>/dev/null; then
  echo "web/e2e: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/memplan-e2e-bin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && go build -o "$tmp/memplan" ./cmd/memplan)
shot=${SCREENSHOT:-}
if [ -n "$shot" ] && [ "${shot#/}" = "$shot" ]; then
  shot="$root/$shot"
fi
MEMPLAN="$tmp/memplan" CHROMIUM="$chromium" SCREENSHOT="$shot" node --test page.test.mjs
