#!/usr/bin/env bash
# Builds everything (tests, examples, benchmarks) and runs the whole test suite,
# then checks that single_include/ is up to date.
#   bash scripts/test.sh [extra `meson test` args, e.g. --suite host]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh

if [ -f build/meson-private/coredata.dat ]; then
  meson setup --reconfigure build
else
  meson setup build
fi
meson compile -C build
meson test -C build --print-errorlogs "$@"
python3 tools/amalgamate.py --check
