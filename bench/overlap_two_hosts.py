#!/usr/bin/env python3
"""Communication behind backward across two simulated hosts: bench/overlap_mlp.cpp (sync and overlap) and PyTorch
DDP over gloo (bench/overlap_ddp.py), one worker per host, alternated in passes (an optimised BLAS: see bench/overlap.sh).

The hosts are bench/multiworker/two_hosts.py's: network namespaces with their own /dev/shm and hostname, one CPU
each, a 1 Gbit/s link (tbf) with a 200 us one-way delay (wire_relay.cpp). There the all-reduce waits on the link
rather than on the CPU, as between real machines; on one host of this 2-core machine the loopback all-reduce is CPU
work that competes with backward (bench/overlap.sh).

    sudo python3 bench/overlap_two_hosts.py                       # from the repository root
    sudo OPENBLAS_CORETYPE=Haswell python3 bench/overlap_two_hosts.py --batch 288 --reps 2
    sudo python3 bench/overlap_two_hosts.py --batch 96 --reps 1 --bucket-mib 16 --modes overlap_bf16,ddp

Modes: sync (all-reduce after backward), overlap (GradientBucketer, float32 on the wire), overlap_bf16 (the same,
bfloat16 on the wire), ddp (PyTorch DDP over gloo, float32 on the wire) and ddp_fp16 (DDP with its
fp16_compress_hook: float16 on the wire, the bytes of overlap_bf16; not in the default modes); ours and DDP's buckets are --bucket-mib
(4 by default). Prints one line per run (the CSV of overlap_mlp.cpp) and a table: each mode's best pass, its ratio to
sync and to DDP. Needs root, iproute2, util-linux, libtorch-dev, python3-torch (the DDP column) and what the library
needs.
"""
import argparse
import json
import os
import secrets
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.dirname(os.path.dirname(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "multiworker"))
import two_hosts  # noqa: E402  (the namespaces and the wire)

import overlap_report  # noqa: E402  (bench/, the script's own folder)


def build(out):
    os.makedirs(out, exist_ok=True)
    src = os.path.join(ROOT, "bench")
    jobs = [
        ["g++", "-std=c++20", "-O2", "-DNDEBUG", "-I" + os.path.join(ROOT, "include"), "-isystem",
         "/usr/include/torch/csrc/api/include", os.path.join(src, "overlap_mlp.cpp"), "-o",
         os.path.join(out, "overlap_mlp"), "-ltorch", "-ltorch_cpu", "-lc10", "-lfmt", "-lboost_json", "-lcrypto",
         "-pthread"],
        ["g++", "-std=c++20", "-O2", os.path.join(src, "multiworker", "wire_relay.cpp"), "-o",
         os.path.join(out, "wire_relay"), "-pthread"],
    ]
    for job in jobs:
        subprocess.run(job, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--bucket-mib", type=float, default=4.0, help="bucket size of ours and of DDP, MiB")
    ap.add_argument("--modes", default="sync,overlap,overlap_bf16,ddp", help="which modes, comma-separated")
    ap.add_argument("--build", default="/tmp/distribute-overlap-two-hosts")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch (DDP column)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in overlap_report.MODES]
    if unknown:
        ap.error(f"--modes: {', '.join(unknown)} not among {', '.join(overlap_report.MODES)}")
    if args.bucket_mib <= 0:
        ap.error(f"--bucket-mib: {args.bucket_mib} is not a positive size")
    if os.geteuid() != 0:
        sys.exit("overlap_two_hosts.py needs root (network namespaces, mounts, tc)")
    two_hosts.BUILD = args.build
    two_hosts.WORKERS_PER_HOST = 1  # rank r on host r
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    if not any(k in blas for k in ("openblas", "blis", "mkl", "atlas")):
        print("overlap: libblas.so.3 is the reference BLAS: libtorch's matrix products are several times slower "
              "(apt-get install libopenblas0-serial)", file=sys.stderr)
    if not args.no_build:
        print(f"building in {args.build} ...", file=sys.stderr)
        build(args.build)
    have_ddp = subprocess.run([args.python, "-c", "import torch.distributed"], capture_output=True).returncode == 0
    if not have_ddp:
        print("python3-torch missing: no DDP column", file=sys.stderr)
    model = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--batch", str(args.batch), "--steps",
             str(args.steps)]
    cpus = sorted(os.sched_getaffinity(0))
    token = secrets.token_hex(16)  # as distribute-launch gives every job
    rows = []
    with two_hosts.TwoHosts(cpus) as hosts:
        for p in range(1, args.reps + 1):
            for mode in [m for m in modes if not m.startswith("ddp") or have_ddp]:
                load = open("/proc/loadavg").read().split()[0]
                print(f"pass {p}/{args.reps}: {mode} ({time.strftime('%H:%M:%S')}, load {load})", file=sys.stderr)
                port = 30000 + (os.getpid() * 7 + int(time.time())) % 20000
                if mode.startswith("ddp"):
                    argv = [args.python, os.path.join(ROOT, "bench", "overlap_ddp.py"), "--bucket-mb",
                            str(args.bucket_mib), "--compress", "fp16" if mode == "ddp_fp16" else "none"] + model
                    env_of = lambda r: {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": hosts.address(0),  # noqa: E731
                                        "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "eth0"}
                else:
                    argv = [os.path.join(args.build, "overlap_mlp"), "--overlap", "0" if mode == "sync" else "1",
                            "--wire", "bf16" if mode == "overlap_bf16" else "fp32", "--bytes-per-pack",
                            str(int(args.bucket_mib * (1 << 20)))] + model
                    cluster = {"worker": [f"{hosts.address(h)}:{port + h}" for h in range(2)]}
                    env_of = lambda r: {"DISTRIBUTE_CLUSTER_TOKEN": token, "TF_CONFIG": json.dumps(  # noqa: E731
                        {"cluster": cluster, "task": {"type": "worker", "index": r}})}
                text = two_hosts.run_ranks(hosts, lambda r: argv, env_of, timeout=1200)
                for line in text.splitlines():
                    if line.startswith("overlap_mlp,"):
                        row = line.split(",")
                        row[1] = mode
                        print(",".join(row), file=sys.stderr)
                        rows.append(row)
    overlap_report.report(rows, "2 hosts x 1 worker, 1 Gbit/s, 200 us")


if __name__ == "__main__":
    main()
