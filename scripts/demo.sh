#!/usr/bin/env bash
# Builds (release) and runs README's demo: the MLP classifier on the UCI handwritten digits
# (examples/digits.cpp) trained with MirroredStrategy<host> on 4 replicas, then with
# OneDeviceStrategy, then with MultiWorkerMirroredStrategy on 3 worker processes started by
# tools/distribute-launch (when the build has it: Boost and OpenSSL), then asynchronously with
# ParameterServerStrategy on 2 ps and 3 workers (examples/parameter_server.cpp; needs cereal too),
# one worker killing itself mid-step and being restarted, then the same MLP in libtorch
# (examples/torch_digits.cpp: OneDevice, Mirrored(4), 2 workers, and bfloat16 gradients). Every run must reach 95% test accuracy. Arguments are passed to every run (e.g. --epochs 20); the metrics CSVs and loss
# plots go to ./digits-out in the directory you called this script from, or to --out DIR.
#   bash scripts/demo.sh [digits args...]
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

echo "demo: building $BUILD/examples/digits and $BUILD/tools/distribute-launch (release)..." >&2
if [ -f "$BUILD/meson-private/coredata.dat" ]; then
  quiet meson setup --reconfigure "$BUILD" --buildtype=release -Dtests=false -Dbench=false
else
  quiet meson setup "$BUILD" --buildtype=release -Dtests=false -Dbench=false
fi
quiet bash scripts/compile.sh "$BUILD" examples/digits tools/distribute-launch  # once more on g++ 12.2's spurious concept failure
PS_TARGET=examples/parameter_server
if meson introspect --targets "$BUILD" | grep -q '"name": "parameter_server"'; then
  quiet bash scripts/compile.sh "$BUILD" "$PS_TARGET"
fi
if meson introspect --targets "$BUILD" | grep -q '"name": "torch_digits"'; then
  quiet bash scripts/compile.sh "$BUILD" examples/torch_digits
fi

DIGITS="$ROOT/$BUILD/examples/digits"
PARAMETER_SERVER="$ROOT/$BUILD/examples/parameter_server"
TORCH_DIGITS="$ROOT/$BUILD/examples/torch_digits"
LAUNCH="$ROOT/$BUILD/tools/distribute-launch"
cd "$CALLER_DIR"

# Where the files go: the last --out among the arguments (the program takes the last one too).
OUT=digits-out
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  if [ "${args[i]}" = "--out" ]; then OUT="${args[i + 1]}"; fi
done

run() {
  echo >&2
  echo "demo: $*" >&2
  "$@"
}

run "$DIGITS" --strategy mirrored --replicas 4 --out digits-out "$@"
run "$DIGITS" --strategy one_device --out digits-out "$@"
if "$DIGITS" --strategies | grep -qx multi_worker; then
  run "$LAUNCH" -n 3 -- "$DIGITS" --strategy multi_worker --out digits-out "$@"
else
  echo "demo: this build has no MultiWorkerMirroredStrategy (needs Boost and OpenSSL); skipped multi_worker" >&2
fi
if [ -x "$PARAMETER_SERVER" ]; then
  # The parameter-server program takes the training arguments but not --strategy/--replicas.
  ps_args=()
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --strategy | --replicas) i=$((i + 1)) ;;
      *) ps_args+=("${args[i]}") ;;
    esac
  done
  run "$LAUNCH" --ps 2 --workers 3 --restart-workers 1 --restart-delay 0.5 -- "$PARAMETER_SERVER" --out digits-out \
    --kill-worker 1 --kill-at-step 20 --wait-for-workers 30 ${ps_args[@]+"${ps_args[@]}"}
else
  echo "demo: this build has no parameter_server example (needs cereal, Boost and OpenSSL); skipped" >&2
fi

if [ -x "$TORCH_DIGITS" ]; then
  # The same MLP in libtorch (torch::nn, autograd): gradients all-reduced as torch::Tensors, then as bfloat16.
  run "$TORCH_DIGITS" --strategy mirrored --replicas 4 --out digits-out
  run "$TORCH_DIGITS" --strategy one_device --out digits-out
  run "$LAUNCH" -n 2 -- "$TORCH_DIGITS" --strategy multi_worker --out digits-out
  run "$TORCH_DIGITS" --strategy mirrored --replicas 4 --grad-dtype bf16 --out digits-out
else
  echo "demo: this build has no torch_digits example (needs libtorch: Debian libtorch-dev); skipped" >&2
fi

OUT_ABS="$(cd "$OUT" && pwd)"
echo >&2
echo "demo: metrics (CSV) and loss curves (SVG) are in $OUT_ABS:" >&2
ls -1 "$OUT_ABS"/metrics-*.csv "$OUT_ABS"/loss-*.svg >&2
