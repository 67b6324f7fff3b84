#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang (-fsanitize=fuzzer,address,undefined) and
# runs each on its committed corpus (tests/fuzz/corpus/<target>/) plus FUZZ_SECONDS of fresh
# fuzzing, FUZZ_JOBS targets at a time. Fails if any target crashes (a sanitizer finding, an
# untyped exception, a broken invariant, a leak, a timeout or running out of its memory limit);
# the crashing input is kept under $FUZZ_BUILD/artifacts/ and the message says where.
#
#   bash scripts/fuzz.sh                       # every target, 60 s each, 2 at a time
#   FUZZ_SECONDS=10 bash scripts/fuzz.sh fuzz_frame fuzz_cluster
#   bash scripts/fuzz.sh --seeds               # rewrite the seed corpus from the library's encoders
#
# Environment: FUZZ_SECONDS (60), FUZZ_JOBS (2), FUZZ_BUILD (build-fuzz), CXX_FUZZ (clang++).
# A crasher, once its bug is fixed, is committed as tests/fuzz/corpus/<target>/regression-<what>.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_JOBS="${FUZZ_JOBS:-2}"
FUZZ_BUILD="${FUZZ_BUILD:-build-fuzz}"
CXX_FUZZ="${CXX_FUZZ:-clang++}"
ALL_TARGETS=(fuzz_frame fuzz_ps fuzz_safetensors fuzz_cluster fuzz_record fuzz_launch_meeting)
# What each target links besides the sanitizer runtimes.
declare -A LIBS=(
  [fuzz_frame]="-lfmt -lcrypto"
  [fuzz_ps]="-lfmt -lcrypto -lssl -lboost_json -pthread"
  [fuzz_safetensors]="-lfmt -lboost_json -pthread"
  [fuzz_cluster]="-lfmt -lboost_json -pthread"
  [fuzz_record]="-lfmt -pthread"
  [fuzz_launch_meeting]="-lfmt -lcrypto"
)

seeds_only=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --seeds) seeds_only=1 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    fuzz_*) targets+=("$arg") ;;
    *) echo "fuzz.sh: unknown argument '$arg' (targets: ${ALL_TARGETS[*]})" >&2; exit 2 ;;
  esac
done
[ "${#targets[@]}" -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [ -n "${LIBS[$t]+x}" ] || { echo "fuzz.sh: no target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

mkdir -p "$FUZZ_BUILD"
start=$SECONDS

if [ "$seeds_only" -eq 1 ]; then
  g++ -std=c++20 -Iinclude tests/fuzz/make_corpus.cpp -o "$FUZZ_BUILD/make_corpus" -lfmt -lcrypto -lboost_json -pthread
  "$FUZZ_BUILD/make_corpus" tests/fuzz/corpus
  exit 0
fi

if ! command -v "$CXX_FUZZ" >/dev/null 2>&1; then
  echo "fuzz.sh: $CXX_FUZZ is not installed (scripts/install-deps.sh installs clang and libclang-rt-*-dev)" >&2
  exit 1
fi
probe="$FUZZ_BUILD/probe.cpp"
printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' >"$probe"
if ! "$CXX_FUZZ" -fsanitize=fuzzer "$probe" -o "$FUZZ_BUILD/probe" 2>"$FUZZ_BUILD/probe.log"; then
  echo "fuzz.sh: $CXX_FUZZ cannot link libFuzzer (Debian: apt-get install libclang-rt-\$(clang++ -dumpversion | cut -d. -f1)-dev):" >&2
  cat "$FUZZ_BUILD/probe.log" >&2
  exit 1
fi

# ---- build (ccache when installed; -MMD files let ccache and a rerun see header changes) ----
CCACHE=""
command -v ccache >/dev/null 2>&1 && CCACHE=ccache
build_one() {
  local t="$1"
  # shellcheck disable=SC2086  # LIBS holds several flags
  $CCACHE "$CXX_FUZZ" -std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude "tests/fuzz/$t.cpp" -o "$FUZZ_BUILD/$t" ${LIBS[$t]}
}
# Starts "$@" in the background once fewer than FUZZ_JOBS jobs run (no `wait -n`: each job's
# status is collected by its pid afterwards).
throttle() {
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do sleep 0.2; done
}
echo "== building ${targets[*]} with $CXX_FUZZ ($FUZZ_JOBS at a time)"
declare -A pid_of=()
for t in "${targets[@]}"; do
  throttle
  build_one "$t" >"$FUZZ_BUILD/$t.build.log" 2>&1 &
  pid_of[$t]=$!
done
build_failed=0
for t in "${targets[@]}"; do
  if ! wait "${pid_of[$t]}"; then
    echo "fuzz.sh: building $t failed:" >&2
    cat "$FUZZ_BUILD/$t.build.log" >&2
    build_failed=1
  fi
done
[ "$build_failed" -eq 0 ] || exit 1
echo "== built in $((SECONDS - start)) s"

# ---- run: the committed corpus first (regressions), then fresh inputs for FUZZ_SECONDS ----
# New inputs go to a scratch corpus, not into the committed one. The memory limits make a decoder
# that allocates on the strength of a length field a crash (malloc over 1 GiB, RSS over 2 GiB).
mkdir -p "$FUZZ_BUILD/artifacts"
run_one() {
  local t="$1" scratch="$FUZZ_BUILD/corpus-$1"
  mkdir -p "$scratch"
  "./$FUZZ_BUILD/$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$FUZZ_BUILD/artifacts/$t-" "$scratch" "tests/fuzz/corpus/$t" \
    >"$FUZZ_BUILD/$t.log" 2>&1
}
run_start=$SECONDS
failed=()
for t in "${targets[@]}"; do
  throttle
  run_one "$t" &
  pid_of[$t]=$!
done
for t in "${targets[@]}"; do
  if wait "${pid_of[$t]}"; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$FUZZ_BUILD/$t.log" | tail -1)"
    echo "== $t: OK (${runs:-?} inputs in ${FUZZ_SECONDS} s; corpus tests/fuzz/corpus/$t: $(ls "tests/fuzz/corpus/$t" | wc -l) seeds)"
  else
    failed+=("$t")
    echo "== $t: CRASHED; the last lines of $FUZZ_BUILD/$t.log:"
    grep -v -E '^#[0-9]+' "$FUZZ_BUILD/$t.log" | tail -40
    ls -1 "$FUZZ_BUILD/artifacts/$t-"* 2>/dev/null | sed 's/^/   crashing input: /'
    echo "   reproduce: ./$FUZZ_BUILD/$t <that file>; once fixed, commit it as tests/fuzz/corpus/$t/regression-<what>"
  fi
done
echo "== fuzzing took $((SECONDS - run_start)) s; everything $((SECONDS - start)) s"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: crashes in ${failed[*]}" >&2
  exit 1
fi
