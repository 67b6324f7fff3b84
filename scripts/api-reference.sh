#!/usr/bin/env bash
# Generates the API reference (Doxygen, from the headers' /// comments) into build-docs/html/.
#   bash scripts/api-reference.sh
# Installs doxygen with apt-get when it is missing. Prints Doxygen's warnings, if any.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! command -v doxygen >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q doxygen
fi
mkdir -p build-docs
doxygen docs/Doxyfile
# Doxygen 1.9 cannot place fmt::formatter specialisations (written outside our namespace); those
# "internal inconsistency" notes are not about our documentation.
grep -v "Internal inconsistency: scope for class fmt::" build-docs/warnings.log >build-docs/warnings-ours.log || true
if [ -s build-docs/warnings-ours.log ]; then
  echo "api-reference: doxygen warnings ($(wc -l <build-docs/warnings-ours.log) lines, build-docs/warnings-ours.log):" >&2
  head -n 40 build-docs/warnings-ours.log >&2
fi
echo "api-reference: open $ROOT/build-docs/html/index.html"
