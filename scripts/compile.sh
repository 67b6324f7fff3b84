#!/usr/bin/env bash
# Builds targets of a configured build directory: bash scripts/compile.sh BUILDDIR [TARGET...]
#
# g++ 12.2 (Debian bookworm's) now and then rejects a correct file with "constraints not satisfied"
# for a type whose tensor_traits specialisation is in scope (seen for ds::Tensor<float> and
# std::array<int, 3>; the same command then compiles it, 10 of 10 times). Where the concept is
# tested by a static_assert the same slip reads "has no ds::tensor_traits specialisation". A build
# that fails with either message is run once more, which recompiles only what failed; any other
# failure, or the same one twice, fails the build.
set -uo pipefail
dir="$1"
shift
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
ninja -C "$dir" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The messages of that slip: one list, tests/support/compile_once_more.py's (its Python compiles use it).
messages="$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import compile_once_more as c; print("\n".join(c.SPURIOUS_CONCEPT_FAILURES))' \
  "$(dirname "${BASH_SOURCE[0]}")/../tests/support")"
if [ "$status" -ne 0 ] && [ -n "$messages" ] && grep -qF "$messages" "$log"; then
  echo "== compile.sh: the build failed with g++'s spurious concept failure; running it once more (see the comment in scripts/compile.sh)"
  ninja -C "$dir" "$@"
  status=$?
fi
exit "$status"
