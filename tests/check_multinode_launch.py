#!/usr/bin/env python3
"""distribute-launch across two simulated hosts: one launcher per host (--nnodes 2), 2 workers each,
run the multi-worker demo; every worker must end with the weights a single-host run of 4 workers
(distribute-launch -n 4 on this machine) ends with, within 1e-5.

Each host is a network namespace with its own address, /dev/shm and hostname (support/netns_hosts.py);
node 1's launcher reaches node 0 at host 0's address and its tasks use host 1's. SKIP (exit 77)
where the machine cannot simulate hosts (not root, no namespaces).

    check_multinode_launch.py DISTRIBUTE_LAUNCH MULTI_WORKER_HELPER
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from netns_hosts import Hosts, Unsupported  # noqa: E402

WEIGHTS = re.compile(r"^\[worker:(\d+)\] weights (.*)$", re.M)


def weights(output):
    """{worker index: [floats]} from the launcher's prefixed output."""
    return {int(m.group(1)): [float(x) for x in m.group(2).split()] for m in WEIGHTS.finditer(output)}


def main():
    launcher, helper = sys.argv[1], sys.argv[2]
    # The reference: the same job on one host.
    single = subprocess.run([launcher, "-n", "4", "--timeout", "120", helper, "demo", "1"], capture_output=True,
                            text=True, timeout=180)
    if single.returncode != 0:
        print(f"FAIL: the single-host run exited {single.returncode}:\n{single.stdout}\n{single.stderr}")
        return 1
    reference = weights(single.stdout)
    if sorted(reference) != [0, 1, 2, 3]:
        print(f"FAIL: the single-host run printed weights for workers {sorted(reference)}:\n{single.stdout}")
        return 1

    try:
        with Hosts(2) as hosts:
            master = hosts.address(0)
            node = lambda rank: [launcher, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", master,
                                 "--master-port", "29511", "--token", "multinode-secret", "-n", "2", "--timeout", "120", helper, "demo", "1"]
            out = hosts.run({0: [node(0)], 1: [node(1)]}, timeout=180)
    except Unsupported as e:
        print(f"SKIP: {e}")
        return 77

    failures = []
    seen = {}
    for host in (0, 1):
        rc, text = out[host][0]
        print(f"--- node {host} (exit {rc}) ---\n{text}")
        if rc != 0:
            failures.append(f"node {host}'s launcher exited {rc}")
        seen.update({w: (host, v) for w, v in weights(text).items()})
    if sorted(seen) != [0, 1, 2, 3]:
        failures.append(f"weights printed by workers {sorted(seen)}, expected 0..3")
    for w, (host, v) in sorted(seen.items()):
        if w // 2 != host:
            failures.append(f"worker:{w} ran on host {host}, expected host {w // 2} (ranks follow node ranks)")
        ref = reference[0]
        if len(v) != len(ref):
            failures.append(f"worker:{w} printed {len(v)} weights, the single-host run {len(ref)}")
            continue
        diff = max(abs(a - b) for a, b in zip(v, ref))
        if diff > 1e-5:
            failures.append(f"worker:{w}'s weights differ from the single-host run's by {diff}")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("OK: 2 nodes x 2 workers end with the single-host run's weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
