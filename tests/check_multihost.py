"""Multi-host test: simulated hosts x workers (2 x 2 unless told) (tests/support/netns_hosts.py), each worker a
net_helper running the collectives battery (every op, odd sizes, exact results checked in the
helper) across the hosts. Checks every worker's results, that each runs on its host, and what
carries each pair's all-reduce data: shared memory inside each host, never across hosts.

    python3 tests/check_multihost.py NET_HELPER [HOSTS [WORKERS_PER_HOST]]   (default 2 2)
    python3 tests/check_multihost.py NET_HELPER kill-worker|kill-host

The kill scenarios: 2 hosts x 2 workers all-reducing in a loop (hierarchical: shared memory inside
each host); one worker of host 1, or the whole of host 1, is SIGKILLed after 3 s, and every survivor
must end with PeerFailure within the heartbeat timeout (3 s) plus slack.

Exit 77 (SKIP) where the machine cannot simulate hosts (not root, no `ip netns`/`unshare`).
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from netns_hosts import Hosts, Unsupported  # noqa: E402

def kill_scenario(helper, what):
    n, per_host, hb_timeout = 4, 2, 3.0
    try:
        with Hosts(2) as hosts:
            addresses = ",".join(f"{hosts.address(r // per_host)}:{29600 + r}" for r in range(n))
            commands = {0: [], 1: []}
            for r in range(n):
                argv = [helper, "loop", "--rank", str(r), "--addresses", addresses, "--count", "100000",
                        "--iters", "100000000", "--hb-interval", "500", "--hb-timeout", str(int(hb_timeout * 1000)),
                        "--connect-timeout", "30000", "--token", "multihost-test"]
                if what == "kill-worker" and r == 3:
                    argv = ["sh", "-c", '"$@" & p=$!; sleep 3; kill -9 $p; wait $p', "sh", *argv]
                commands[r // per_host].append(argv)
            start = time.monotonic()
            out = hosts.run(commands, timeout=60, kill_host=(1, 3) if what == "kill-host" else None)
            took = time.monotonic() - start
    except Unsupported as e:
        print(f"SKIP: {e}")
        return 77
    failures = []
    survivors = [0, 1, 2] if what == "kill-worker" else [0, 1]
    for r in range(n):
        rc, text = out[r // per_host][r % per_host]
        print(f"---- worker {r} on host{r // per_host} (exit {rc}):\n{text}")
        if r in survivors:
            if rc != 3 or "EXC PeerFailure" not in text or "READY" not in text:
                failures.append(f"worker {r} did not end with PeerFailure after running (exit {rc})")
    # Killed at 3 s; every survivor must have given up within the heartbeat timeout and some slack.
    if took > 3 + hb_timeout + 10:
        failures.append(f"the survivors took {took:.1f} s to end")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"OK: {what}: every survivor ended with PeerFailure, all done {took:.1f} s after the start")
    return 0


def main():
    helper = os.path.abspath(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2].startswith("kill-"):
        return kill_scenario(helper, sys.argv[2])
    HOSTS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    PER_HOST = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    n = HOSTS * PER_HOST
    host_of = [r // PER_HOST for r in range(n)]
    failures = []
    try:
        with Hosts(HOSTS) as hosts:
            addresses = ",".join(f"{hosts.address(host_of[r])}:{29500 + r}" for r in range(n))
            commands = {h: [] for h in range(HOSTS)}
            for r in range(n):
                commands[host_of[r]].append([helper, "collectives", "--rank", str(r), "--addresses", addresses,
                                             "--op-timeout", "60000", "--connect-timeout", "30000",
                                             "--token", "multihost-test"])
            out = hosts.run(commands, timeout=240)
    except Unsupported as e:
        print(f"SKIP: {e}")
        return 77
    pairs = {}
    for h in range(HOSTS):
        for i, (rc, text) in enumerate(out[h]):
            r = h * PER_HOST + i
            print(f"---- worker {r} on host{h} (exit {rc}):\n{text}")
            if rc != 0:
                failures.append(f"worker {r} exited with {rc}")
            if f"HOST host{h}\n" not in text:
                failures.append(f"worker {r} does not run on host{h}")
            # The helper checks every result itself: exit 0 and no WRONG line means all were exact.
            if "READY" not in text or "WRONG" in text:
                failures.append(f"worker {r} did not run the battery exactly")
            for line in text.splitlines():
                if line.startswith("PAIR "):
                    _, a, b, how = line.split()
                    pairs[(int(a), int(b))] = how
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            how = pairs.get((a, b))
            if how is None:
                failures.append(f"worker {a} reported no transport for worker {b}")
            elif host_of[a] != host_of[b] and how != "tcp":
                failures.append(f"workers {a} (host{host_of[a]}) and {b} (host{host_of[b]}) use {how} across hosts")
            elif host_of[a] == host_of[b] and how != "shm":
                failures.append(f"workers {a} and {b} share host{host_of[a]} but use {how}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"OK: {HOSTS} hosts x {PER_HOST} workers, every collective exact, shared memory inside each host only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
