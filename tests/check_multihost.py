"""Multi-host test: simulated hosts (tests/support/netns_hosts.py), each worker a net_helper running
the collectives battery (every op, odd sizes, exact results and bitwise-identical inexact ones,
checked in the helper) across the hosts. Checks every worker's results, that each runs on its host,
what carries each pair's all-reduce data (shared memory inside each host, never across), and who
carries a large all-reduce: with shared memory, each rank of the smallest host leads a part of it
(its TCP share and its share of the segment traffic, from the helper's metrics).

    python3 tests/check_multihost.py NET_HELPER [HOSTS [WORKERS_PER_HOST]]   (default 2 2)
    python3 tests/check_multihost.py NET_HELPER --layout 0,1,0,1,0 [--tcp-only]
    python3 tests/check_multihost.py NET_HELPER kill-worker|kill-host|mismatch

--layout gives each rank's host (here 3 workers on host0 and 2 on host1, interleaved);
--tcp-only turns shared memory off (--shm-min 0): the flat TCP algorithms across hosts.

The kill scenarios: 2 hosts x 2 workers all-reducing in a loop (hierarchical: shared memory inside
each host); one worker of host 1, or the whole of host 1, is SIGKILLed after 3 s, and every survivor
must end with PeerFailure within the heartbeat timeout (3 s) plus slack. mismatch: 2 hosts x 2
workers, the last one all-reduces one element more (a small buffer, then a large one): every worker
ends with InvalidArgument naming the mismatch.

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


def mismatch_scenario(helper):
    n, per_host = 4, 2
    failures = []
    for variant in ("count", "ring-count"):
        try:
            with Hosts(2) as hosts:
                addresses = ",".join(f"{hosts.address(r // per_host)}:{29700 + r}" for r in range(n))
                commands = {0: [], 1: []}
                for r in range(n):
                    commands[r // per_host].append([helper, "mismatch", "--variant", variant, "--rank", str(r),
                                                    "--addresses", addresses, "--op-timeout", "30000",
                                                    "--connect-timeout", "30000", "--token", "multihost-test"])
                out = hosts.run(commands, timeout=60)
        except Unsupported as e:
            print(f"SKIP: {e}")
            return 77
        for r in range(n):
            rc, text = out[r // per_host][r % per_host]
            print(f"---- {variant}: worker {r} on host{r // per_host} (exit {rc}):\n{text}")
            if rc != 0 or "OK InvalidArgument" not in text or "mismatched collectives at collective #1" not in text:
                failures.append(f"{variant}: worker {r} did not end with InvalidArgument naming the mismatch (exit {rc})")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: mismatched all-reduces across hosts (small and large) throw InvalidArgument on every worker")
    return 0


def main():
    helper = os.path.abspath(sys.argv[1])
    args = sys.argv[2:]
    if args and args[0].startswith("kill-"):
        return kill_scenario(helper, args[0])
    if args and args[0] == "mismatch":
        return mismatch_scenario(helper)
    tcp_only = "--tcp-only" in args
    args = [a for a in args if a != "--tcp-only"]
    if args and args[0] == "--layout":
        host_of = [int(h) for h in args[1].split(",")]
    else:
        hosts_n = int(args[0]) if args else 2
        per_host = int(args[1]) if len(args) > 1 else 2
        host_of = [r // per_host for r in range(hosts_n * per_host)]
    n = len(host_of)
    HOSTS = max(host_of) + 1
    on_host = {h: [r for r in range(n) if host_of[r] == h] for h in range(HOSTS)}
    shared = not tcp_only and any(len(rs) > 1 for rs in on_host.values())
    failures = []
    try:
        with Hosts(HOSTS) as hosts:
            addresses = ",".join(f"{hosts.address(host_of[r])}:{29500 + r}" for r in range(n))
            commands = {h: [] for h in range(HOSTS)}
            for r in range(n):
                commands[host_of[r]].append([helper, "collectives", "--rank", str(r), "--addresses", addresses,
                                             "--op-timeout", "60000", "--connect-timeout", "30000",
                                             "--token", "multihost-test"] + (["--shm-min", "0"] if tcp_only else []))
            out = hosts.run(commands, timeout=240)
    except Unsupported as e:
        print(f"SKIP: {e}")
        return 77
    pairs = {}
    sent = {}
    link = {}  # host -> {all-reduce bytes: bytes out of its eth0}
    resent = {}  # host -> {all-reduce bytes: TCP segments it retransmitted meanwhile}
    for h in range(HOSTS):
        for i, (rc, text) in enumerate(out[h]):
            r = on_host[h][i]
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
                elif line.startswith("SENT "):
                    _, amount, _, size = line.split()
                    sent[r] = (int(amount), int(size))
                elif line.startswith("LINK "):
                    _, amount, _, size = line.split()
                    link.setdefault(h, {})[int(size)] = int(amount)
                elif line.startswith("RETRANSMITTED "):
                    _, segments, _, _, size = line.split()
                    resent.setdefault(h, {})[int(size)] = int(segments)
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            how = pairs.get((a, b))
            want = "shm" if shared and host_of[a] == host_of[b] else "tcp"
            if how is None:
                failures.append(f"worker {a} reported no transport for worker {b}")
            elif how != want:
                failures.append(f"workers {a} (host{host_of[a]}) and {b} (host{host_of[b]}) use {how}, not {want}")
    if shared:
        # A part per rank of the smallest host: rank k of a host (k < parts) leads part k. What it sends
        # in the large all-reduce: its buffer into the segment, its part into the segment again for the
        # all-gather, and its part to each other host's leader over TCP (direct across 2 hosts; with
        # more hosts the ring or halving-doubling sends 2(H-1)/H of it). Others send their buffer in.
        parts = min(len(rs) for rs in on_host.values())
        across = 1.0 if HOSTS == 2 else 2.0 * (HOSTS - 1) / HOSTS
        for r in range(n):
            if r not in sent:
                failures.append(f"worker {r} reported no SENT line")
                continue
            amount, size = sent[r]
            leads = on_host[host_of[r]].index(r) < parts
            want = size + (size / parts) * (1 + across) if leads else size
            if abs(amount - want) > 0.02 * want:
                failures.append(f"worker {r} sent {amount} bytes in an all-reduce of {size}, want about {want:.0f} "
                                f"({'leader of a part' if leads else 'no part'} of {parts})")
    # How often each host's data crosses between hosts (its eth0 bytes, with the TCP/IP headers and the
    # acknowledgements of what it received: within 12% above, once TCP's retransmissions are taken
    # off: veth delivers on whichever CPU sent, so segments arrive out of order now and then and TCP
    # resends whole 64 KiB bursts it took for lost): once in each direction through a host's
    # leaders (hierarchical; 2(H-1)/H with more than 2 hosts, the ring or halving-doubling among
    # leaders), likewise two ranks on two hosts (direct) and halving-doubling nearest partners first on
    # 2 hosts of 2 (4 MiB); the ring placed host by host crosses each host boundary with 2(n-1)/n of it
    # (8 MiB, TCP only). Farthest partners first would send twice the buffer out of each host.
    contiguous = host_of == sorted(host_of) and len({len(rs) for rs in on_host.values()}) == 1
    for size in (4 << 20, 8 << 20):
        if shared:
            want = size * (1.0 if HOSTS == 2 else 2.0 * (HOSTS - 1) / HOSTS)
        elif n == 2 and HOSTS == 2:
            want = size
        elif HOSTS == 2 and n == 4 and contiguous:
            want = size if size <= 4 << 20 else size * 2.0 * (n - 1) / n
        else:
            continue
        for h in range(HOSTS):
            got = link.get(h, {}).get(size)
            # A retransmitted segment is at most one full frame on eth0 (MTU 1500 + the Ethernet header).
            again = resent.get(h, {}).get(size, 0) * 1514
            if got is None:
                failures.append(f"host{h} reported no eth0 count for the {size}-byte all-reduce")
            elif not (want <= got and got - again <= 1.12 * want):
                failures.append(f"host{h} sent {got} bytes out in a {size}-byte all-reduce ({again} of them at most "
                                f"retransmitted), want {want:.0f} to {1.12 * want:.0f} besides retransmissions")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    layout = ",".join(map(str, host_of))
    print(f"OK: {HOSTS} hosts, ranks on hosts {layout}{' (TCP only)' if tcp_only else ''}: every collective exact "
          f"and bitwise identical, {'shared memory inside each host only, a leader per part' if shared else 'TCP between every pair'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
