#!/usr/bin/env python3
"""TensorFlow's MirroredStrategy all-reduce on 4 logical CPUs beside ours, in one run.

TF side: tf.distribute.MirroredStrategy over 4 logical CPU devices
(tf.config.set_logical_device_configuration), per-replica float32 tensors of SIZE bytes made once
(inputs TF may not write, like our const lvalues), and one `ctx.all_reduce(SUM, x)` per step inside a
tf.function; median of --iterations steps after a warm-up. Our side: bench_allreduce_host's
allreduce_const (const lvalues, a new result each step), allreduce_into (const lvalues into outputs kept
across steps), allreduce (moved buffers) and memcpy rows for the same sizes, run right after TF's
(--rounds times, alternating with TF's; every figure is the median over the rounds). TensorFlow comes from the conformance suite's venv
(~/.cache/distribute-tf-venv, made by scripts/conformance.sh) or --python.

  python3 bench/tf_allreduce.py [--sizes 1048576,67108864] [--iterations 20] [--rounds 3] [--bench build-bench/bench/bench_allreduce_host]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TF_SIDE = r"""
import json, statistics, sys, time
import tensorflow as tf
sizes, iterations, replicas = json.loads(sys.argv[1])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
devices = [d.name for d in tf.config.list_logical_devices("CPU")][:replicas]
strategy = tf.distribute.MirroredStrategy(devices)
out = {}
for size in sizes:
    n = size // 4
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([n], float(ctx.replica_id_in_sync_group + 1)))

    @tf.function
    def step(v):
        def fn(x):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)
        return strategy.run(fn, args=(v,))

    expected = float(replicas * (replicas + 1) // 2)
    for r in strategy.experimental_local_results(step(values)):
        if float(r[0]) != expected or float(r[-1]) != expected:
            sys.exit(f"TF all_reduce returned {float(r[0])}, expected {expected}")
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        step(values)  # eager CPU execution is synchronous: the results exist when it returns
        times.append((time.perf_counter() - start) * 1e3)
    out[size] = statistics.median(times)
print(json.dumps(out))
"""


def tf_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    venv = Path(os.environ.get("DISTRIBUTE_TF_VENV", Path.home() / ".cache" / "distribute-tf-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"tf_allreduce: no TensorFlow venv at {venv}: run `bash scripts/conformance.sh` once "
                 "(it makes it) or pass --python")
    return str(python)


def ours(bench: Path, sizes: list[int], replicas: int) -> dict[tuple[str, int], float]:
    sizes_re = "|".join(str(s) for s in sizes)
    cmd = [str(bench), f"--replicas={replicas}",
           f"--benchmark_filter=(memcpy|allreduce<SharedMemoryAllReduce>|allreduce_const|allreduce_into).*bytes:({sizes_re})/",
           "--benchmark_format=json"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    rows = {}
    for b in json.loads(proc.stdout)["benchmarks"]:
        m = re.match(r"([a-z_]+)(?:<[^>]*>)?/bytes:(\d+)/", b["name"])
        if not m or b.get("run_type") == "aggregate":
            continue
        p50 = b.get("p50_us")
        rows[(m.group(1), int(m.group(2)))] = (p50 / 1e3) if p50 else b["real_time"]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1048576,16777216,67108864", help="bytes per replica, comma-separated")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="TF then ours, this many times; medians over the rounds")
    ap.add_argument("--bench", default=str(ROOT / "build-bench" / "bench" / "bench_allreduce_host"))
    ap.add_argument("--before", help="another bench_allreduce_host (e.g. an older commit's), run after ours each round")
    ap.add_argument("--python", help="a Python with tensorflow (default: the conformance venv)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bench = Path(args.bench)
    if not bench.exists():
        sys.exit(f"tf_allreduce: {bench} is missing: `meson setup build-bench --buildtype=release -Dtests=false "
                 "-Dexamples=false && ninja -C build-bench bench/bench_allreduce_host`")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    tf_runs, our_runs, before_runs = [], [], []
    before = Path(args.before) if args.before else None
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        tf = subprocess.run([tf_python(args.python), "-c", TF_SIDE, json.dumps([sizes, args.iterations, args.replicas])],
                            stdout=subprocess.PIPE, text=True, env=env, check=True)
        tf_runs.append({int(k): v for k, v in json.loads(tf.stdout.strip().splitlines()[-1]).items()})
        our_runs.append(ours(bench, sizes, args.replicas))
        if before:
            before_runs.append(ours(before, sizes, args.replicas))
        loads.append(os.getloadavg()[0])
    tf_ms = {s: statistics.median(r[s] for r in tf_runs) for s in sizes}
    print(f"{args.replicas} replicas, float32 SUM, median ms over {args.rounds} rounds (TF, then ours"
          f"{', then --before' if before else ''}, alternating); load average {min(loads):.2f}-{max(loads):.2f}")
    for label, runs in (("ours", our_runs), ("--before", before_runs)):
        if runs:
            print(f"\n{label}: {before if runs is before_runs else bench}\n")
            table(tf_ms, {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]}, sizes)
    return 0


def table(tf_ms: dict[int, float], mine: dict[tuple[str, int], float], sizes: list[int]) -> None:
    print("| size per replica | TF MirroredStrategy | ours, const lvalues | ours, const lvalues into kept outputs | "
          "ours, moved buffers | memcpy of all | TF / ours (const) | TF / ours (into) | "
          "ours const / memcpy | ours into / memcpy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in sizes:
        c, i, m, cp = (mine.get((row, s)) for row in ("allreduce_const", "allreduce_into", "allreduce", "memcpy"))

        def f(x):
            return f"{x:.4g}" if x is not None else "–"

        def ratio(a, b):
            return f"{a / b:.2f}" if a is not None and b else "–"

        size = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        print(f"| {size} | {f(tf_ms[s])} | {f(c)} | {f(i)} | {f(m)} | {f(cp)} | {ratio(tf_ms[s], c)} | "
              f"{ratio(tf_ms[s], i)} | {ratio(c, cp)} | {ratio(i, cp)} |")


if __name__ == "__main__":
    sys.exit(main())
