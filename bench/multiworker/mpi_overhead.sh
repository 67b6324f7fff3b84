#!/usr/bin/env bash
# The MPI transport (CommunicationImplementation::Mpi, net/mpi.hpp) against a raw MPI_Allreduce loop:
# float32 SUM, same sizes, same timing rule (common.hpp), alternated pass by pass in one run: ours as
# a strategy gets it by default (blocking MPI calls) and with an operation timeout (non-blocking
# calls driven by MPI_Test, MW_MPI_TIMEOUT_MS),
# under Open MPI's shared memory (vader) and TCP loopback. Prints one markdown table of the best
# median of each over the passes and their ratio.
#
#   bench/multiworker/mpi_overhead.sh            # from the repository root
#   NPS="2 4" REPS=3 bench/multiworker/mpi_overhead.sh
#
# Needs: apt-get install -y openmpi-bin libopenmpi-dev libboost-json-dev libssl-dev libfmt-dev
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$ROOT/bench/multiworker
BUILD=${BUILD:-/tmp/distribute-mpi-overhead}
NPS=${NPS:-"2 4"}
REPS=${REPS:-3}
mkdir -p "$BUILD"
echo "building in $BUILD ..." >&2
mpicxx.openmpi -std=c++20 -O2 -DNDEBUG -DDISTRIBUTE_WITH_MPI -I"$ROOT/include" "$SRC/ours_mpi.cpp" -o "$BUILD/ours_mpi" -lfmt &
mpicxx.openmpi -std=c++17 -O2 -DNDEBUG "$SRC/mpi_allreduce.cpp" -o "$BUILD/mpi_allreduce"
wait
sync; sleep 3

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun.openmpi --oversubscribe --mca mpi_yield_when_idle 1 --mca pml ob1)
CSV=$BUILD/results.csv
: > "$CSV"
for np in $NPS; do
  for ((pass = 1; pass <= REPS; pass++)); do
    echo "np=$np pass $pass/$REPS ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
    for btl in vader tcp; do
      flags=(--mca btl "$btl,self")
      [ "$btl" = tcp ] && flags+=(--mca btl_tcp_if_include lo)
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" "$BUILD/mpi_allreduce" "raw_$btl" >> "$CSV"
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" "$BUILD/ours_mpi" "ours_$btl" >> "$CSV"
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" -x MW_MPI_TIMEOUT_MS=600000 "$BUILD/ours_mpi" "timeout_$btl" >> "$CSV"
    done
  done
done

python3 - "$CSV" <<'PY'
import csv, sys
best = {}
for impl, np_, b, iters, med, mn in csv.reader(open(sys.argv[1])):
    k = (impl, int(np_), int(b))
    best[k] = min(best.get(k, float("inf")), float(med))
def size(b):
    return f"{b >> 20} MiB" if b % (1 << 20) == 0 else f"{b >> 10} KiB"
print("| np | size | raw MPI_Allreduce, vader ms | ours over MPI, vader ms | ratio | with a timeout | ratio "
      "| raw, TCP ms | ours, TCP ms | ratio | with a timeout | ratio |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for n in sorted({k[1] for k in best}):
    for b in sorted({k[2] for k in best if k[1] == n}):
        g = lambda i: best.get((i, n, b), float("nan"))
        rv, ov, tv = g("raw_vader"), g("ours_vader"), g("timeout_vader")
        rt, ot, tt = g("raw_tcp"), g("ours_tcp"), g("timeout_tcp")
        print(f"| {n} | {size(b)} | {rv:.3f} | {ov:.3f} | {ov / rv:.2f}x | {tv:.3f} | {tv / rv:.2f}x "
              f"| {rt:.3f} | {ot:.3f} | {ot / rt:.2f}x | {tt:.3f} | {tt / rt:.2f}x |")
PY
