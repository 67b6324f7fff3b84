#!/usr/bin/env bash
# Multi-worker float32 SUM all-reduce on one host: distribute's Communicator vs gloo (libgloo-dev)
# and OpenMPI MPI_Allreduce (libopenmpi-dev), same script, one after the other.
#
#   bench/multiworker/run.sh            # from the repository root
#   NPS="2 4" REPS=2 BUILD=/tmp/mw-build bench/multiworker/run.sh
#   IMPLS="ours gloo_hd" MW_SIZES="1048576 16777216" NPS=4 bench/multiworker/run.sh   # a short targeted run
#   IMPLS="ours_bound ours" MW_LOAD=2 bench/multiworker/run.sh   # bound against unbound, beside 2 busy processes
#
# Needs: apt-get install -y libgloo-dev openmpi-bin libopenmpi-dev
# Ours runs as distribute-launch runs its tasks by default (unbound); ours_bound binds them as
# `distribute-launch --bind-to core` does (see ours_cpus). MW_LOAD=N runs N busy processes beside
# every measurement: a machine another job is using.
# For each np, each pass runs: ours as a user gets it (on one host, all-reduces from 256 KiB go
# through shared memory), ours over TCP only (MW_SHM_MIN_BYTES=0), gloo ring (gloo::allreduce),
# gloo halving-doubling, OpenMPI over TCP loopback (ob1/tcp on lo), OpenMPI shared memory (vader,
# what mpirun picks on one host); one unrecorded warm-up of each comes first. Each driver times every
# iteration after a barrier, takes the max over ranks and prints the median (see common.hpp).
# With REPS>1 the lowest median over passes is kept, for every implementation alike. Prints one
# markdown table; raw CSV goes to $BUILD/results.csv (one row per implementation, np, size, pass).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$ROOT/bench/multiworker
BUILD=${BUILD:-/tmp/distribute-multiworker}
NPS=${NPS:-"2 4"}
REPS=${REPS:-2}
IMPLS=${IMPLS:-"ours ours_tcp gloo_ring gloo_hd mpi_tcp mpi_vader"}  # which of them to run (the table shows nan for the rest)
export MW_SIZES=${MW_SIZES:-}  # bytes, space-separated; default 4 KiB, 64 KiB, 1, 16, 64 MiB (common.hpp)
PORT=${PORT:-31700}
mkdir -p "$BUILD"

echo "building in $BUILD ..." >&2
g++ -std=c++20 -O2 -DNDEBUG -I"$ROOT/include" "$SRC/ours.cpp" -o "$BUILD/ours" -lfmt -lboost_json -lssl -lcrypto -pthread &
case " $IMPLS " in *" gloo_"*) g++ -std=c++17 -O2 -DNDEBUG "$SRC/gloo_allreduce.cpp" -o "$BUILD/gloo_allreduce" -lgloo -pthread ;; esac
case " $IMPLS " in *" mpi_"*) mpicxx -std=c++17 -O2 -DNDEBUG "$SRC/mpi_allreduce.cpp" -o "$BUILD/mpi_allreduce" ;; esac
wait
# The first implementation measured ran ~40% slow at np=2 1 MiB in most runs: the build's output
# was still being written back. Settle before timing anything.
sync; sleep 3

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --mca mpi_yield_when_idle 1)
CSV=$BUILD/results.csv
: > "$CSV"

# ours_bound places ranks as `distribute-launch --bind-to core` does: with np no more than the
# CPUs available, rank r is bound to the r-th of np equal contiguous blocks of them (as mpirun
# binds ranks to cores at np <= 2); with k times more ranks than CPUs, CPU j runs ranks
# jk .. jk+k-1; otherwise unbound. Plain ours runs unbound, as distribute-launch does by default.
BIND_OURS=0
read -r -a CPUS <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
ours_cpus() {  # rank np -> a taskset CPU list, or nothing
  local r=$1 np=$2 cpus=("${CPUS[@]}") nc=${#CPUS[@]}
  [ "$BIND_OURS" = 1 ] || return 0
  if (( np > nc )); then
    (( np % nc == 0 )) && echo "${cpus[r / (np / nc)]}"
    return 0
  fi
  local share=$(( nc / np )) extra=$(( nc % np ))
  local first=$(( r * share + (r < extra ? r : extra) )) count=$(( share + (r < extra ? 1 : 0) ))
  local IFS=,
  echo "${cpus[*]:first:count}"
}
run_ours() {  # np label (extra environment comes with the call)
  local np=$1 label=$2 pids=() r bind
  PORT=$((PORT + 16))
  for ((r = 1; r < np; r++)); do
    bind=$(ours_cpus $r $np)
    ${bind:+taskset -c "$bind"} "$BUILD/ours" $r $np $PORT > /dev/null & pids+=($!)
  done
  bind=$(ours_cpus 0 $np)
  ${bind:+taskset -c "$bind"} "$BUILD/ours" 0 $np $PORT | sed "s/^ours,/$label,/" >> "$CSV"
  for p in "${pids[@]}"; do wait "$p"; done
}
run_gloo() {  # np algo
  local np=$1 algo=$2 pids=() r dir
  dir=$(mktemp -d)
  for ((r = 1; r < np; r++)); do "$BUILD/gloo_allreduce" $r $np "$dir" $algo > /dev/null & pids+=($!); done
  "$BUILD/gloo_allreduce" 0 $np "$dir" $algo >> "$CSV"
  for p in "${pids[@]}"; do wait "$p"; done
  rm -rf "$dir"
}
run_mpi_tcp() {
  "${MPIRUN[@]}" -np $1 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$BUILD/mpi_allreduce" mpi_tcp >> "$CSV"
}
run_mpi_vader() {
  "${MPIRUN[@]}" -np $1 --mca pml ob1 --mca btl vader,self "$BUILD/mpi_allreduce" mpi_vader >> "$CSV"
}

# MW_LOAD=N: N busy processes for the whole run (another job on the machine), stopped at exit.
LOAD_PIDS=()
for ((k = 0; k < ${MW_LOAD:-0}; k++)); do (while :; do :; done) & LOAD_PIDS+=($!); done
trap '[ ${#LOAD_PIDS[@]} -eq 0 ] || kill "${LOAD_PIDS[@]}" 2>/dev/null' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run_impl() {  # impl np
  case $1 in
    ours) run_ours "$2" ours ;;
    ours_bound) BIND_OURS=1 run_ours "$2" ours_bound ;;
    ours_tcp_bound) MW_SHM_MIN_BYTES=0 BIND_OURS=1 run_ours "$2" ours_tcp_bound ;;
    ours_tcp) MW_SHM_MIN_BYTES=0 run_ours "$2" ours_tcp ;;
    # With a timeline recorded (docs/observability.md), and with metrics counted: their cost.
    ours_timeline) DISTRIBUTE_TIMELINE=$BUILD/timeline.json run_ours "$2" ours_timeline ;;
    ours_tcp_timeline) MW_SHM_MIN_BYTES=0 DISTRIBUTE_TIMELINE=$BUILD/timeline.json run_ours "$2" ours_tcp_timeline ;;
    ours_metrics) MW_METRICS=1 run_ours "$2" ours_metrics ;;
    gloo_ring) run_gloo "$2" ring ;;
    gloo_hd) run_gloo "$2" hd ;;
    mpi_tcp) run_mpi_tcp "$2" ;;
    mpi_vader) run_mpi_vader "$2" ;;
    *) echo "unknown impl $1" >&2; exit 2 ;;
  esac
}

# Warm-up, not recorded (WARMUP=0 skips it): every implementation once, 1 MiB only. Without it the
# first implementation timed (ours) ran 10-45% slow at np=2 1 MiB in pass 1 of most runs, after the
# build had finished and settled; the implementations after it did not.
if [ "${WARMUP:-1}" = 1 ]; then
  echo "warm-up, not recorded ($(date +%T))" >&2
  # Assignments before a function call last for that call only.
  for impl in $IMPLS; do CSV=/dev/null MW_SIZES=1048576 run_impl "$impl" "${NPS%% *}"; done
fi

for np in $NPS; do
  for ((pass = 1; pass <= REPS; pass++)); do
    echo "np=$np pass $pass/$REPS ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
    for impl in $IMPLS; do run_impl "$impl" "$np"; done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$CSV" <<'PY'
import csv, sys
best, passes = {}, {}
for impl, np_, b, iters, med, mn in csv.reader(open(sys.argv[1])):
    k = (impl, int(np_), int(b))
    best[k] = min(best.get(k, float("inf")), float(med))
    passes.setdefault(k, []).append(float(med))
def size(b):
    if b % (1 << 20) == 0: return f"{b >> 20} MiB"
    return f"{b >> 10} KiB" if b % 1024 == 0 else f"{b} B"
def bw(b, ms, n):
    alg = b / (ms * 1e-3) / 1e9
    return alg, alg * 2 * (n - 1) / n
print("| np | size | ours ms | ours algbw | ours busbw | ours TCP ms | gloo ring ms | gloo hd ms | MPI-TCP ms | MPI vader ms | ours vs gloo best | ours vs MPI best | ours TCP vs MPI-TCP |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for n in sorted({k[1] for k in best}):
    for b in sorted({k[2] for k in best if k[1] == n}):
        g = lambda i: best.get((i, n, b), float("nan"))
        o, ot, gr, gh, mt, mv = g("ours"), g("ours_tcp"), g("gloo_ring"), g("gloo_hd"), g("mpi_tcp"), g("mpi_vader")
        oa, ob = bw(b, o, n)
        print(f"| {n} | {size(b)} | {o:.3f} | {oa:.2f} | {ob:.2f} | {ot:.3f} | {gr:.3f} | {gh:.3f} | {mt:.3f} | {mv:.3f} "
              f"| {min(gr, gh) / o:.2f}× | {min(mt, mv) / o:.2f}× | {mt / ot:.2f}× |")
extra = sorted({k for k in best if k[0] in ("ours_timeline", "ours_tcp_timeline", "ours_metrics")})
if extra:
    print()
    print("| observing | np | size | ms | without | cost |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for impl, n, b in extra:
        base = best.get(("ours_tcp" if impl.startswith("ours_tcp") else "ours", n, b), float("nan"))
        print(f"| {impl} | {n} | {size(b)} | {best[(impl, n, b)]:.3f} | {base:.3f} | {(best[(impl, n, b)] / base - 1) * 100:+.1f}% |")
bound = sorted({k for k in best if k[0] == "ours_bound"})
if bound:
    # Every pass, not only the best: binding's risk is the slow pass on a busy machine.
    print()
    print("| binding | np | size | unbound ms, each pass | bound ms, each pass | bound/unbound, best | bound/unbound, worst |")
    print("| --- | --- | --- | --- | --- | ---: | ---: |")
    for _, n, b in bound:
        u, o = passes.get(("ours", n, b), [float("nan")]), passes[("ours_bound", n, b)]
        fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)
        print(f"| | {n} | {size(b)} | {fmt(u)} | {fmt(o)} | {min(o) / min(u):.2f}× | {max(o) / max(u):.2f}× |")
print()
print("algbw/busbw in GB/s (1e9); 'X vs Y' = Y's time / X's (> 1: X faster); 'best' = the faster of the two")
print("gloo algorithms / of OpenMPI over TCP and over shared memory (vader).")
PY
