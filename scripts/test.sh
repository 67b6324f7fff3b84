#!/usr/bin/env bash
# Builds everything (tests, examples, benchmarks) and runs the whole test suite,
# then checks that single_include/ is up to date.
#   bash scripts/test.sh [extra `meson test` args, e.g. --suite host]
#   DISTRIBUTE_SETUP_ARGS=-Dbench=false bash scripts/test.sh   # without building the benchmarks
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh

# A CUDA toolkit in its usual place is often not on PATH. meson finds nvcc through PATH only
# (Debian bookworm's meson 1.0 reads no CUDACXX/NVCC variable), and without it the cuda suite
# would not be built: put the toolkit's bin/ on PATH, and set CUDACXX for tools that read it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  echo "test.sh: nvcc was not on PATH; using $CUDACXX"
fi

# DISTRIBUTE_SETUP_ARGS: options for `meson setup` (CI passes -Dbench=false).
read -r -a setup_args <<< "${DISTRIBUTE_SETUP_ARGS:-}"
if [ -f build/meson-private/coredata.dat ]; then
  meson setup --reconfigure build "${setup_args[@]}"
else
  meson setup build "${setup_args[@]}"
fi
bash scripts/compile.sh build   # meson compile, once more on g++ 12.2's spurious constraint error
meson test -C build --print-errorlogs "$@"
python3 tools/amalgamate.py --check
