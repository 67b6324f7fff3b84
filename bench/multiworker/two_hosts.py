#!/usr/bin/env python3
"""Two simulated hosts x 2 workers, float32 SUM all-reduce: ours against gloo and OpenMPI, in one run.

Each host is a network namespace whose processes get their own /dev/shm and hostname (unshare), and
one CPU of the machine (taskset: host A the first CPU, host B the second), so every implementation
finds what it would on two small machines; the wire delivers to each host on that host's CPU. Between the hosts: a 1 Gbit/s link (a tbf qdisc on each
side's eth0) with a 200 us one-way delay (wire_relay.cpp: this kernel has no netem). Every
implementation runs the drivers of run.sh (common.hpp's timing rule: barrier, time one call, max
over ranks, median), one after the other, in passes; the table keeps each one's lowest median over
the passes and the per-pass ratio of ours to the best peer.

    sudo python3 bench/multiworker/two_hosts.py                     # from the repository root
    sudo python3 bench/multiworker/two_hosts.py --before main --reps 3
    sudo python3 bench/multiworker/two_hosts.py --impls ours,gloo_hd --sizes 1048576

  --before REF   also runs ours built from REF's include/ (the same driver): before/after in one run
  --impls        any of ours, ours_before, gloo_ring, gloo_hd, mpi, mpi_han (default: all that apply)

Needs root, iproute2, util-linux, libgloo-dev, openmpi-bin, libopenmpi-dev, and the libraries
ours needs. The namespaces are named h21<pid>a/b and removed at exit, whatever happens.
"""
import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SRC = os.path.join(ROOT, "bench", "multiworker")
RATE_BITS = 1_000_000_000
DELAY_US = 200
# tbf's bucket: a little over one of the relay's 64 KiB segments (a larger bucket lets the first
# bytes of each all-reduce through faster than the link: 256 KiB took 1 MiB below the link limit).
BURST = "70kb"
WORKERS_PER_HOST = 2
HOSTS = 2


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, **kw)


def build(out, before):
    os.makedirs(out, exist_ok=True)
    jobs = []
    ours_libs = ["-lfmt", "-lboost_json", "-lssl", "-lcrypto", "-pthread"]
    jobs.append(["g++", "-std=c++20", "-O2", "-DNDEBUG", "-I" + os.path.join(ROOT, "include"),
                 os.path.join(SRC, "ours.cpp"), "-o", os.path.join(out, "ours")] + ours_libs)
    if before:
        tree = os.path.join(out, "before")
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", ROOT, "archive", before, "include"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        jobs.append(["g++", "-std=c++20", "-O2", "-DNDEBUG", "-I" + os.path.join(tree, "include"),
                     os.path.join(SRC, "ours.cpp"), "-o", os.path.join(out, "ours_before")] + ours_libs)
    jobs.append(["g++", "-std=c++17", "-O2", "-DNDEBUG", os.path.join(SRC, "gloo_allreduce.cpp"), "-o",
                 os.path.join(out, "gloo_allreduce"), "-lgloo", "-pthread"])
    jobs.append(["mpicxx.openmpi", "-std=c++17", "-O2", "-DNDEBUG", os.path.join(SRC, "mpi_allreduce.cpp"), "-o",
                 os.path.join(out, "mpi_allreduce")])
    jobs.append(["g++", "-std=c++20", "-O2", os.path.join(SRC, "wire_relay.cpp"), "-o", os.path.join(out, "wire_relay"),
                 "-pthread"])
    for job in jobs:  # one at a time: the machine may be small
        sh(*job)


class TwoHosts:
    """The namespaces, the wire between them and the way to run a command on a host."""

    def __init__(self, cpus):
        tag = os.getpid() % 100000
        self.ns = [f"h21{tag}a", f"h21{tag}b"]
        self.subnet = f"10.21.{os.getpid() % 250 + 1}"
        self.cpus = cpus
        self.relay = None
        self.made = []

    def address(self, h):
        return f"{self.subnet}.{h + 1}"

    def __enter__(self):
        try:
            for ns in self.ns:
                sh("ip", "netns", "add", ns)
                self.made.append(ns)
            # Each direction's relay thread on the CPU of the host it delivers to: that host's receive path.
            pins = [str(self.cpus[h % len(self.cpus)]) for h in range(HOSTS)] if self.cpus else []
            self.relay = subprocess.Popen([os.path.join(BUILD, "wire_relay"), *self.ns, str(DELAY_US), *pins],
                                          stdout=subprocess.PIPE, text=True)
            if self.relay.stdout.readline().strip() != "ready":
                raise RuntimeError("wire_relay did not start")
            for h, ns in enumerate(self.ns):
                sh("ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                # The rate on each side's way out (BURST above), a queue of 20 ms at the rate.
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                   f"{RATE_BITS // 1_000_000}mbit", "burst", BURST, "latency", "20ms")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.relay is not None:
            self.relay.kill()
            self.relay.wait()
            self.relay = None
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False)
        self.made = []
        return False

    def wrap(self, h, argv):
        """argv run on host h: its network namespace, a private /dev/shm, hostname hostA/hostB, its CPU."""
        inner = f"mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && hostname host{'AB'[h]} && exec \"$@\""
        pin = ["taskset", "-c", str(self.cpus[h % len(self.cpus)])] if self.cpus else []
        return pin + ["ip", "netns", "exec", self.ns[h], "unshare",
                "--mount", "--uts", "--fork", "--propagation", "private", "sh", "-c", inner, "sh", *argv]


def run_ranks(hosts, argv_of, env_of, timeout):
    """Starts rank r's argv on host r // WORKERS_PER_HOST; returns rank 0's output."""
    n = HOSTS * WORKERS_PER_HOST
    procs = []
    for r in range(n):
        env = dict(os.environ, **env_of(r))
        out = subprocess.PIPE if r == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(hosts.wrap(r // WORKERS_PER_HOST, argv_of(r)), env=env, stdout=out, text=True,
                                      start_new_session=True))
    try:
        text, _ = procs[0].communicate(timeout=timeout)
        for p in procs[1:]:
            p.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return text


def run_impl(hosts, impl, sizes, timeout):
    n = HOSTS * WORKERS_PER_HOST
    env = {"MW_SIZES": " ".join(map(str, sizes))}
    if impl in ("ours", "ours_before"):
        port = 30000 + (os.getpid() * 7 + int(time.time())) % 20000
        addresses = ",".join(f"{hosts.address(r // WORKERS_PER_HOST)}:{port + r}" for r in range(n))
        binary = os.path.join(BUILD, impl)
        text = run_ranks(hosts, lambda r: [binary, str(r), str(n), "0"],
                         lambda r: dict(env, MW_ADDRESSES=addresses), timeout)
        return text.replace("ours,", impl + ",", -1)
    if impl in ("gloo_ring", "gloo_hd"):
        store = tempfile.mkdtemp(prefix="h21-gloo-")
        try:
            binary = os.path.join(BUILD, "gloo_allreduce")
            return run_ranks(hosts, lambda r: [binary, str(r), str(n), store, impl[5:]],
                             lambda r: dict(env, MW_GLOO_HOST=hosts.address(r // WORKERS_PER_HOST)), timeout)
        finally:
            shutil.rmtree(store, ignore_errors=True)
    if impl in ("mpi", "mpi_han"):
        # mpirun on host A; its daemon on host B starts through this "ssh": the host's namespaces.
        agent = os.path.join(BUILD, "rsh_agent")
        with open(agent, "w") as f:
            wrapped = " ".join(shlex.quote(a) for a in hosts.wrap(1, ["sh", "-c"]))
            f.write(f"#!/bin/sh\n# two_hosts.py: OpenMPI's way onto simulated host B\nshift\nexec {wrapped} \"$*\"\n")
        os.chmod(agent, 0o755)
        argv = ["mpirun.openmpi", "--allow-run-as-root", "-np", str(n), "--host",
                f"{hosts.address(0)}:{WORKERS_PER_HOST},{hosts.address(1)}:{WORKERS_PER_HOST}",
                "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,vader,self", "--mca", "btl_tcp_if_include", "eth0",
                "--mca", "oob_tcp_if_include", "eth0", "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none",
                "-x", "MW_SIZES"]
        if impl == "mpi_han":
            # han: OpenMPI's hierarchical collectives (4.1.4's crashes on MPI_IN_PLACE: separate buffers).
            argv += ["--mca", "coll_han_priority", "100", "-x", "MW_MPI_SEPARATE_BUFFERS=1"]
        argv += [os.path.join(BUILD, "mpi_allreduce"), impl]
        p = subprocess.Popen(hosts.wrap(0, argv), env=dict(os.environ, **env), stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            text, _ = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return text
    raise ValueError(f"unknown implementation {impl}")


def link_limit_ms(size):
    """S bytes one way over the link: 1448 payload bytes per 1514-byte frame at the rate, plus the delay."""
    return size * 1514 / 1448 * 8 / RATE_BITS * 1e3 + DELAY_US / 1e3


def main():
    global BUILD
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="also run ours built from this ref's include/")
    ap.add_argument("--impls", help="comma-separated: ours, ours_before, gloo_ring, gloo_hd, mpi, mpi_han")
    ap.add_argument("--sizes", default="1048576,16777216,67108864", help="bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=2, help="passes over every implementation")
    ap.add_argument("--build", default="/tmp/distribute-two-hosts")
    ap.add_argument("--no-build", action="store_true", help="reuse the binaries in --build")
    ap.add_argument("--no-pin", action="store_true", help="leave every process unbound (default: a CPU per host)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("two_hosts.py needs root (network namespaces, mounts, tc)")
    BUILD = args.build
    sizes = [int(s) for s in args.sizes.split(",")]
    impls = args.impls.split(",") if args.impls else (
        ["ours"] + (["ours_before"] if args.before else []) + ["gloo_ring", "gloo_hd", "mpi", "mpi_han"])
    print(f"building in {BUILD} ...", file=sys.stderr)
    if not args.no_build:
        build(BUILD, args.before)
    cpus = [] if args.no_pin else sorted(os.sched_getaffinity(0))
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = {}  # (impl, size) -> [median per pass]
    with TwoHosts(cpus) as hosts:
        for p in range(1, args.reps + 1):
            for impl in impls:
                load = open("/proc/loadavg").read().split()[0]
                print(f"pass {p}/{args.reps}: {impl} ({time.strftime('%H:%M:%S')}, load {load})", file=sys.stderr)
                text = run_impl(hosts, impl, sizes, timeout=900)
                print(text.strip(), file=sys.stderr)  # impl,np,bytes,iterations,median ms,min ms
                for line in text.splitlines():
                    parts = line.strip().split(",")
                    if len(parts) == 6:
                        rows.setdefault((impl, int(parts[2])), []).append(float(parts[4]))
    peers = [i for i in impls if not i.startswith("ours")]
    print()
    head = "| size | " + " | ".join(f"{i} ms" for i in impls) + " | link limit ms | ours vs best peer | ours / link limit |"
    print(head)
    print("|" + " --- |" * 1 + " ---: |" * (len(impls) + 3))
    for size in sizes:
        best = {i: min(rows.get((i, size), [float("nan")])) for i in impls}
        peer = min((best[i] for i in peers), default=float("nan"))
        ours = best.get("ours", float("nan"))
        limit = link_limit_ms(size)
        name = f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size} B"
        print(f"| {name} | " + " | ".join(f"{best[i]:.1f}" for i in impls) +
              f" | {limit:.1f} | {peer / ours:.2f}× | {ours / limit:.2f}× |")
    print()
    print("Per pass, ours vs the best peer of that pass (> 1: ours faster):")
    for size in sizes:
        ratios = []
        for p in range(args.reps):
            try:
                peer = min(rows[(i, size)][p] for i in peers if (i, size) in rows)
                ratios.append(f"{peer / rows[('ours', size)][p]:.2f}")
            except (KeyError, IndexError, ValueError):
                ratios.append("nan")
        print(f"  {size >> 20} MiB: {', '.join(ratios)}")
    print("\n'best peer' = the fastest of " + ", ".join(peers) + "; link limit = S per direction at 1 Gbit/s "
          "(1448 payload bytes per 1514-byte frame) plus the 200 us delay.")


if __name__ == "__main__":
    main()
