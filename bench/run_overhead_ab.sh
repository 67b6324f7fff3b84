#!/usr/bin/env bash
# strategy.run() overhead at two commits, measured alternately in one run (A, B, A, B, ...), so
# that a change to the hot path (e.g. the observability hooks, docs/performance.md) is compared
# under the same load. Builds bench/run_overhead.cpp from each commit's include/ and bench/
# (git archive, g++ -O2 -DNDEBUG), runs the run/ benchmarks ROUNDS times each, and prints per
# benchmark the median over rounds of the mean and of the p50 step time, and B's change.
#
#   bench/run_overhead_ab.sh A_COMMIT B_COMMIT [ROUNDS]     # from the repository root; ROUNDS default 6
#   FILTER='^run/Mirrored' CPUS=0,1 bench/run_overhead_ab.sh 707878a 51804fd 10
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,9p "$0" >&2; exit 2; }
A=$1 B=$2 ROUNDS=${3:-6}
FILTER=${FILTER:-'^run/'}
CPUS=${CPUS:-0,1}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for c in "$A" "$B"; do
  mkdir -p "$WORK/$c"
  git archive "$c" include bench | tar -x -C "$WORK/$c"
  (cd "$WORK/$c" && g++ -std=c++20 -O2 -DNDEBUG -Iinclude bench/run_overhead.cpp bench/alloc_counter.cpp \
     -o "$WORK/run_overhead-$c" -lbenchmark -lfmt -lboost_json -lssl -lcrypto -pthread) &
done
wait
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((i = 1; i <= ROUNDS; i++)); do
  for c in "$A" "$B"; do
    taskset -c "$CPUS" "$WORK/run_overhead-$c" --benchmark_filter="$FILTER" --benchmark_format=json \
      > "$WORK/$c-$i.json" 2>/dev/null
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$WORK" "$A" "$B" <<'PY'
import glob, json, statistics, sys
work, a, b = sys.argv[1:]
res = {}
for c in (a, b):
    for f in glob.glob(f"{work}/{c}-*.json"):
        for r in json.load(open(f))["benchmarks"]:
            name = r["name"].split("/min_time")[0]
            res.setdefault((name, c), []).append((r["real_time"], r.get("p50_us", float("nan"))))
print(f"| benchmark | {a} mean µs | {b} mean µs | change | {a} p50 µs | {b} p50 µs |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name in sorted({k[0] for k in res}):
    ma = statistics.median(x[0] for x in res[(name, a)])
    mb = statistics.median(x[0] for x in res[(name, b)])
    pa = statistics.median(x[1] for x in res[(name, a)])
    pb = statistics.median(x[1] for x in res[(name, b)])
    print(f"| `{name}` | {ma:.3f} | {mb:.3f} | {(mb / ma - 1) * 100:+.1f}% | {pa:.2f} | {pb:.2f} |")
PY
