#!/usr/bin/env bash
# Builds (release) and runs the logistic-regression demo. Arguments are passed to it;
# it runs in the directory you called this script from.
#   bash scripts/demo.sh [demo args...]
set -euo pipefail

CALLER_DIR="$PWD"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh

BUILD=build-demo
# Configure and build quietly; show the log only if something fails.
quiet() {
  local log
  log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "demo: failed: $*" >&2
    exit 1
  fi
  rm -f "$log"
}

echo "demo: building $BUILD/examples/logistic_regression (release)..." >&2
if [ -f "$BUILD/meson-private/coredata.dat" ]; then
  quiet meson setup --reconfigure "$BUILD" --buildtype=release -Dtests=false -Dbench=false
else
  quiet meson setup "$BUILD" --buildtype=release -Dtests=false -Dbench=false
fi
quiet meson compile -C "$BUILD" examples/logistic_regression

cd "$CALLER_DIR"
exec "$ROOT/$BUILD/examples/logistic_regression" "$@"
