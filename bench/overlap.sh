#!/usr/bin/env bash
# Communication behind backward (issue: overlap): steps/s of a libtorch MLP (~21 M parameters) at
# MultiWorker np=2 over TCP, gradients all-reduced after backward (sync) or bucket by bucket while backward
# runs (overlap, GradientBucketer), beside PyTorch DDP over gloo with the same model, data and batch
# (bench/overlap_ddp.py; skipped when python3-torch is missing). The three alternate, REPS passes; the
# table keeps each one's best pass. Ours runs over TCP even on one host (shared memory off), as across hosts.
#
#   bench/overlap.sh                          # from the repository root
#   BATCH=32 REPS=3 HIDDEN=2048 LAYERS=5 bench/overlap.sh
#
# Needs: libtorch-dev (and python3-torch for the DDP column), libboost-json-dev, libssl-dev, libfmt-dev, and an
# optimised BLAS: Debian's libtorch multiplies through libblas.so.3, by default the reference BLAS, with which
# forward + backward here took 685 ms instead of 141-250 ms with libopenblas0-serial (communication 11% of a step
# instead of about 40%). Where OpenBLAS does not know the CPU model it falls back to SSE3 kernels; set
# OPENBLAS_CORETYPE (Haswell on an AVX2 machine) for its AVX2 ones (docs/performance.md, "Overlap").
set -euo pipefail
case "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null)" in
  *openblas* | *blis* | *mkl* | *atlas*) ;;
  *) echo "overlap: libblas.so.3 is the reference BLAS: libtorch's matrix products are several times slower" \
          "(apt-get install libopenblas0-serial)" >&2 ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-/tmp/distribute-overlap}
REPS=${REPS:-3}
HIDDEN=${HIDDEN:-2048}
LAYERS=${LAYERS:-5}
BATCH=${BATCH:-16}
STEPS=${STEPS:-20}
mkdir -p "$BUILD"
echo "building in $BUILD ..." >&2
TORCH_INC=(-isystem /usr/include/torch/csrc/api/include)
g++ -std=c++20 -O2 -DNDEBUG -I"$ROOT/include" "${TORCH_INC[@]}" "$ROOT/bench/overlap_mlp.cpp" -o "$BUILD/overlap_mlp" \
  -ltorch -ltorch_cpu -lc10 -lfmt -lboost_json -lcrypto -pthread &
g++ -std=c++20 -O2 -I"$ROOT/include" "$ROOT/tools/distribute-launch.cpp" -o "$BUILD/distribute-launch" -lfmt -lboost_json -lcrypto -pthread
wait
sync; sleep 3

ARGS=(--hidden "$HIDDEN" --layers "$LAYERS" --batch "$BATCH" --steps "$STEPS")
CSV=$BUILD/results.csv
: > "$CSV"
PYTORCH=${PYTORCH:-/usr/bin/python3}  # Debian's python3-torch lives in the system interpreter
have_ddp=0
"$PYTORCH" -c 'import torch.distributed' 2>/dev/null && have_ddp=1 || echo "python3-torch missing: no DDP column" >&2
for ((pass = 1; pass <= REPS; pass++)); do
  echo "pass $pass/$REPS ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  for overlap in 0 1; do
    MW_SHM_MIN_BYTES=0 "$BUILD/distribute-launch" -n 2 --timeout 600 "$BUILD/overlap_mlp" --overlap $overlap "${ARGS[@]}" |
      sed -n 's/^\[worker:0\] //p' >> "$CSV"
  done
  if [ "$have_ddp" = 1 ]; then
    "$BUILD/distribute-launch" -n 2 --timeout 600 "$PYTORCH" "$ROOT/bench/overlap_ddp.py" "${ARGS[@]}" |
      sed -n 's/^\[worker:0\] //p' >> "$CSV"
  fi
done

python3 "$ROOT/bench/overlap_report.py" "$CSV" "2 workers over TCP"
