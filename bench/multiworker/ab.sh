#!/usr/bin/env bash
# Before/after of our all-reduce at two commits, in alternating rounds, beside OpenMPI's shared
# memory (vader): the drivers of run.sh, each commit's ours.cpp built from `git archive`. Ranks run
# unbound, as distribute-launch runs them by default; BIND=core binds them as --bind-to core does.
#
#   bench/multiworker/ab.sh BEFORE_REF AFTER_REF          # from the repository root
#   NP=2 ROUNDS=3 MW_SIZES="4096 1048576" bench/multiworker/ab.sh 3c941a4 HEAD
#
# Prints, per implementation and size, the median over rounds of each round's median (ms) and the
# range, then after / before of those medians; "_tcp" rows run with MW_SHM_MIN_BYTES=0. Needs openmpi-bin and libopenmpi-dev.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BEFORE=${1:?usage: ab.sh BEFORE_REF AFTER_REF}; AFTER=${2:?usage: ab.sh BEFORE_REF AFTER_REF}
NP=${NP:-8}; ROUNDS=${ROUNDS:-5}
export MW_SIZES=${MW_SIZES:-"4096 1048576"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BUILD=$(mktemp -d /tmp/distribute-ab.XXXXXX)
trap 'rm -rf "$BUILD"' EXIT
for v in before after; do
  ref=$BEFORE; [ $v = after ] && ref=$AFTER
  mkdir -p "$BUILD/$v" && git -C "$ROOT" archive "$ref" include bench/multiworker | tar -x -C "$BUILD/$v"
  g++ -std=c++20 -O2 -DNDEBUG -I"$BUILD/$v/include" "$BUILD/$v/bench/multiworker/ours.cpp" -o "$BUILD/$v/ours" \
    -lfmt -lboost_json -lssl -lcrypto -pthread &
done
mpicxx -std=c++17 -O2 -DNDEBUG "$ROOT/bench/multiworker/mpi_allreduce.cpp" -o "$BUILD/mpi_allreduce"
wait
sync; sleep 3
read -r -a CPUS <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
cpu_of() {  # BIND=core: as run.sh's ours_bound (k ranks per CPU when there are k times more ranks, else blocks of CPUs)
  local r=$1 nc=${#CPUS[@]}
  [ "${BIND:-none}" = core ] || return 0
  if (( NP > nc )); then (( NP % nc == 0 )) && echo "${CPUS[r / (NP / nc)]}"; return 0; fi
  local share=$(( nc / NP )) extra=$(( nc % NP )) IFS=,
  local first=$(( r * share + (r < extra ? r : extra) )) count=$(( share + (r < extra ? 1 : 0) ))
  echo "${CPUS[*]:first:count}"
}
PORT=${PORT:-$((20000 + RANDOM % 20000))}
run_ours() {  # binary label
  local pids=() r bind
  PORT=$((PORT + 16))
  for ((r = 1; r < NP; r++)); do
    bind=$(cpu_of $r)
    ${bind:+taskset -c "$bind"} "$1" $r $NP $PORT > /dev/null & pids+=($!)
  done
  bind=$(cpu_of 0)
  ${bind:+taskset -c "$bind"} "$1" 0 $NP $PORT | sed "s/^ours,/$2,/"
  for p in "${pids[@]}"; do wait "$p"; done
}
CSV=$BUILD/ab.csv
for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round, load $(cut -d' ' -f1 /proc/loadavg)" >&2
  run_ours "$BUILD/before/ours" before >> "$CSV"
  run_ours "$BUILD/after/ours" after >> "$CSV"
  MW_SHM_MIN_BYTES=0 run_ours "$BUILD/before/ours" before_tcp >> "$CSV"
  MW_SHM_MIN_BYTES=0 run_ours "$BUILD/after/ours" after_tcp >> "$CSV"
  mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np "$NP" --mca pml ob1 --mca btl vader,self "$BUILD/mpi_allreduce" mpi_vader >> "$CSV"
done
python3 - "$CSV" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    impl, np_, b, _, med, _ = line.strip().split(",")
    d[(impl, int(np_), int(b))].append(float(med))
print("| impl | np | bytes | median ms | range |")
print("| --- | --- | ---: | ---: | --- |")
for k in sorted(d, key=lambda k: (k[1], k[2], k[0])):
    print(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(d[k]):.4f} | {min(d[k]):.4f}–{max(d[k]):.4f} |")
print()
print("| np | bytes | after / before | after_tcp / before_tcp |")
print("| --- | ---: | ---: | ---: |")
med = {k: statistics.median(v) for k, v in d.items()}
for n, b in sorted({(k[1], k[2]) for k in d}):
    cells = [f"{med[(a, n, b)] / med[(o, n, b)]:.3f}" if (a, n, b) in med and (o, n, b) in med else "-"
             for a, o in (("after", "before"), ("after_tcp", "before_tcp"))]
    print(f"| {n} | {b} | {cells[0]} | {cells[1]} |")
PY
