#!/usr/bin/env python3
"""TensorFlow's MirroredStrategy all-reduce on 4 logical CPUs beside ours, in one run.

TF side: tf.distribute.MirroredStrategy over 4 logical CPU devices
(tf.config.set_logical_device_configuration), per-replica float32 tensors of SIZE bytes made once
(inputs TF may not write, like our const lvalues), and one `ctx.all_reduce(SUM, x)` per step inside a
tf.function; median of --iterations steps after a warm-up. Our side: bench_allreduce_host's
allreduce_const (const lvalues, a new result each step), allreduce (moved buffers) and memcpy rows for
the same sizes, run right after TF's. TensorFlow comes from the conformance suite's venv
(~/.cache/distribute-tf-venv, made by scripts/conformance.sh) or --python.

  python3 bench/tf_allreduce.py [--sizes 1048576,67108864] [--iterations 20] [--bench build-bench/bench/bench_allreduce_host]
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
           f"--benchmark_filter=(memcpy|allreduce<SharedMemoryAllReduce>|allreduce_const).*bytes:({sizes_re})/",
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
    ap.add_argument("--bench", default=str(ROOT / "build-bench" / "bench" / "bench_allreduce_host"))
    ap.add_argument("--python", help="a Python with tensorflow (default: the conformance venv)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bench = Path(args.bench)
    if not bench.exists():
        sys.exit(f"tf_allreduce: {bench} is missing: `meson setup build-bench --buildtype=release -Dtests=false "
                 "-Dexamples=false && ninja -C build-bench bench/bench_allreduce_host`")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    tf = subprocess.run([tf_python(args.python), "-c", TF_SIDE, json.dumps([sizes, args.iterations, args.replicas])],
                        stdout=subprocess.PIPE, text=True, env=env, check=True)
    tf_ms = {int(k): v for k, v in json.loads(tf.stdout.strip().splitlines()[-1]).items()}
    mine = ours(bench, sizes, args.replicas)
    load = os.getloadavg()[0]
    print(f"{args.replicas} replicas, float32 SUM, median ms; load average {load:.2f}")
    print()
    print("| size per replica | TF MirroredStrategy | ours, const lvalues | ours, moved buffers | memcpy of all | "
          "TF / ours (const) | TF / ours (moved) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in sizes:
        c, m, cp = mine.get(("allreduce_const", s)), mine.get(("allreduce", s)), mine.get(("memcpy", s))
        def f(x):
            return f"{x:.3f}" if x is not None else "–"
        print(f"| {s >> 20} MiB | {f(tf_ms[s])} | {f(c)} | {f(m)} | {f(cp)} | "
              f"{tf_ms[s] / c:.2f} | {tf_ms[s] / m:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
