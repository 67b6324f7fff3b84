#!/usr/bin/env python3
"""The parameter server against TensorFlow 2.21's ParameterServerStrategy, alternated in one run.

Both sides: 2 ps tasks and 3 workers on loopback, the coordinator in the driving process, closures
scheduled one after another and joined; closures/s of an empty function, and updates/s of one
`assign_add` of a 1 KiB and a 1 MiB float32 variable per closure, the delta sent with every closure
(TF: a fresh tensor per closure, as ours sends its argument each time; TF keeps a copy per remote
device of a tensor passed again). Ours: bench/ps_throughput.cpp (`bench_ps_throughput`). TF:
tf.distribute.Server processes and a ClusterCoordinator, from the conformance suite's venv
(~/.cache/distribute-tf-venv, made by scripts/conformance.sh) or --python. Each round runs TF, then
ours; the table gives each round's figures and the ratio of ours to TF's in that round.

  python3 bench/ps_throughput_tf.py [--rounds 3] [--closures 3000] [--bench build/bench/bench_ps_throughput]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ["empty closure", "assign_add of 1 KiB float32", "assign_add of 1024 KiB float32"]

TF_SERVER = r"""
import json, os, sys
import tensorflow as tf
cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
server = tf.distribute.Server(cluster, job_name=sys.argv[2], task_index=int(sys.argv[3]), protocol="grpc", start=True)
print("serving", flush=True)
server.join()
"""

TF_COORDINATOR = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
cluster_def, closures = json.loads(sys.argv[1]), int(sys.argv[2])
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(cluster_def), rpc_layer="grpc", task_type="chief", task_id=0)
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
out = {}

@tf.function
def empty():
    return None

for _ in range(200):  # warm-up, as ours
    coordinator.schedule(empty)
coordinator.join()
start = time.perf_counter()
for _ in range(closures):
    coordinator.schedule(empty)
coordinator.join()
out["empty closure"] = closures / (time.perf_counter() - start)

for size in (1 << 10, 1 << 20):
    n = size // 4
    with strategy.scope():
        v = tf.Variable(tf.zeros([n], tf.float32))

    @tf.function
    def add_to(delta):
        v.assign_add(delta)

    host = np.ones([n], np.float32)
    count = closures if size <= 4096 else max(1, closures // 10)
    coordinator.schedule(add_to, args=(tf.constant(host),))  # traced before timing
    coordinator.join()
    start = time.perf_counter()
    for _ in range(count):
        coordinator.schedule(add_to, args=(tf.constant(host),))  # a fresh tensor per closure
    coordinator.join()
    seconds = time.perf_counter() - start
    value = v.numpy()
    if value[0] != count + 1 or value[-1] != count + 1:
        sys.exit(f"TF: wrong result {value[0]} after {count + 1} updates")
    out[f"assign_add of {size >> 10} KiB float32"] = count / seconds
print(json.dumps(out))
"""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_tf(python: str, closures: int) -> dict[str, float]:
    ports = free_ports(6)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"chief": [addr[5]], "ps": addr[0:2], "worker": addr[2:5]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    servers = []
    try:
        for job, index in [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2)]:
            servers.append(subprocess.Popen([python, "-c", TF_SERVER, json.dumps(cluster), job, str(index)], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for s in servers:
            if s.stdout.readline().strip() != "serving":
                sys.exit("a TF server did not start")
        result = subprocess.run([python, "-c", TF_COORDINATOR, json.dumps(cluster), str(closures)], env=env,
                                capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            sys.exit(f"TF coordinator failed:\n{result.stderr[-4000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        for s in servers:
            s.kill()
            s.wait()


def run_ours(bench: str, closures: int) -> dict[str, float]:
    result = subprocess.run([bench, str(closures)], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"{bench} failed:\n{result.stdout}\n{result.stderr}")
    out = {}
    for line in result.stdout.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\d+)\s+([\d.]+)\s+(\d+)", line)
        if m and m.group(1) in CASES:
            out[m.group(1)] = float(m.group(4))
    if set(out) != set(CASES):
        sys.exit(f"unexpected output of {bench}:\n{result.stdout}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--closures", type=int, default=3000, help="per case (the 1 MiB case runs a tenth)")
    parser.add_argument("--bench", default=str(ROOT / "build" / "bench" / "bench_ps_throughput"))
    parser.add_argument("--python", default=os.environ.get("DISTRIBUTE_TF_VENV", str(Path.home() / ".cache" / "distribute-tf-venv"))
                        + "/bin/python")
    args = parser.parse_args()
    rows = {case: {"ours": [], "tf": []} for case in CASES}
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        tf = run_tf(args.python, args.closures)
        ours = run_ours(args.bench, args.closures)
        print(f"round {r + 1} (load {load:.1f}): " + "; ".join(
            f"{c}: ours {ours[c]:.0f}/s, TF {tf[c]:.0f}/s, {ours[c] / tf[c]:.2f}x" for c in CASES), file=sys.stderr)
        for c in CASES:
            rows[c]["ours"].append(ours[c])
            rows[c]["tf"].append(tf[c])
    print("| case | ours (per round) /s | TF (per round) /s | ours / TF per round | median ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for c in CASES:
        o, t = rows[c]["ours"], rows[c]["tf"]
        ratios = [a / b for a, b in zip(o, t)]
        print(f"| {c} | {' / '.join(f'{x:,.0f}' for x in o)} | {' / '.join(f'{x:,.0f}' for x in t)} | "
              f"{' / '.join(f'{x:.2f}x' for x in ratios)} | **{statistics.median(ratios):.2f}x** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
