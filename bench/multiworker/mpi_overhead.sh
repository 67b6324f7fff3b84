#!/usr/bin/env bash
# The MPI transport (CommunicationImplementation::Mpi, net/mpi.hpp) against a raw MPI_Allreduce loop:
# float32 SUM, same sizes, same timing rule (common.hpp), under Open MPI's shared memory (vader) and
# TCP loopback. ours_mpi.cpp times a raw MPI_Allreduce and ours in turn in every iteration, so both
# see the same load; it runs as a strategy gets it by default (MPI's blocking calls), without the
# agreement check (mpi_check_agreement = false, MW_MPI_UNCHECKED) and with an operation timeout
# (non-blocking calls driven by MPI_Test, MW_MPI_TIMEOUT_MS). Prints one markdown
# table: for each, the median over the passes of each pass's ratio (ours' median / raw's median, in
# the same run) and its range.
#
#   bench/multiworker/mpi_overhead.sh            # from the repository root
#   NPS="2 4" REPS=5 bench/multiworker/mpi_overhead.sh
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
mpicxx.openmpi -std=c++20 -O2 -DNDEBUG -DDISTRIBUTE_WITH_MPI -I"$ROOT/include" "$SRC/ours_mpi.cpp" -o "$BUILD/ours_mpi" -lfmt
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
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" "$BUILD/ours_mpi" "ours_$btl" | sed "s/^/$pass,/" >> "$CSV"
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" -x MW_MPI_UNCHECKED=1 "$BUILD/ours_mpi" "unchecked_$btl" |
        sed "s/^/$pass,/" >> "$CSV"
      "${MPIRUN[@]}" -np "$np" "${flags[@]}" -x MW_MPI_TIMEOUT_MS=600000 "$BUILD/ours_mpi" "timeout_$btl" |
        sed "s/^/$pass,/" >> "$CSV"
    done
  done
done

python3 - "$CSV" <<'PY'
import collections, csv, statistics, sys
med = {}
for pass_, impl, np_, b, iters, m, mn in csv.reader(open(sys.argv[1])):
    med[(int(pass_), impl, int(np_), int(b))] = float(m)
def size(b):
    return f"{b >> 20} MiB" if b % (1 << 20) == 0 else f"{b >> 10} KiB"
ratios = collections.defaultdict(list)  # (label, np, bytes) -> ours/raw per pass
raws = collections.defaultdict(list)
for (p, impl, n, b), m in med.items():
    if impl.startswith("raw_"):
        continue
    raw = med.get((p, "raw_" + impl, n, b))
    if raw:
        ratios[(impl, n, b)].append(m / raw)
        raws[(impl, n, b)].append(raw)
def cell(impl, n, b):
    r = ratios.get((impl, n, b))
    if not r:
        return "nan | nan"
    return f"{statistics.median(r):.2f}× ({min(r):.2f}–{max(r):.2f})"
def raw_ms(n, b, btl):
    r = raws.get((f"ours_{btl}", n, b))
    return f"{statistics.median(r):.3f}" if r else "nan"
WHAT = ("ours", "unchecked", "timeout")
print("| np | size | " + " | ".join(f"{btl}: raw ms | ours / raw | unchecked / raw | with a timeout / raw"
                                     for btl in ("vader", "TCP")) + " |")
print("| --- | --- | " + " | ".join(["---:"] * 8) + " |")
for n in sorted({k[1] for k in ratios}):
    for b in sorted({k[2] for k in ratios if k[1] == n}):
        cells = " | ".join(" | ".join([raw_ms(n, b, btl)] + [cell(f"{what}_{btl}", n, b) for what in WHAT])
                           for btl in ("vader", "tcp"))
        print(f"| {n} | {size(b)} | {cells} |")
print()
print("x / raw: the median over passes of (x's median / the raw loop's median in the same run), range in brackets; "
      "raw ms: the raw loop's median in the default runs; unchecked: mpi_check_agreement = false.")
PY
