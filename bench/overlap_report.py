#!/usr/bin/env python3
"""The table of the overlap benchmarks (bench/overlap.sh, bench/overlap_two_hosts.py), from the CSV lines of
bench/overlap_mlp.cpp and bench/overlap_ddp.py: each mode's best pass, its ratio to sync and to DDP, and the share
of communication in a synchronous step.

    python3 bench/overlap_report.py RESULTS.CSV "2 workers over TCP"
"""
import csv
import sys

MODES = ("sync", "overlap", "overlap_bf16", "ddp", "ddp_fp16")


def report(rows, setting):
    """rows: overlap_mlp,mode,workers,params,batch,steps,steps_per_s,step_ms,allreduce_ms,compute_ms."""
    best, allreduce, compute = {}, [], []
    for _, mode, _workers, params, batch, _steps, sps, step_ms, ar_ms, comp_ms in rows:
        if float(sps) > best.get(mode, (0.0,))[0]:
            best[mode] = (float(sps), float(step_ms), params, batch)
        if ar_ms:
            allreduce.append(float(ar_ms))
            compute.append(float(comp_ms))
    if "sync" not in best:
        print("no synchronous run finished: no table")
        return
    sync = best["sync"]
    print(f"model: {sync[2]} parameters, batch {sync[3]} per worker, {setting}")
    if allreduce:
        ar, comp = min(allreduce), min(compute)
        print(f"one all-reduce of every gradient alone: {ar:.1f} ms; forward + backward alone: {comp:.1f} ms "
              f"(communication {100 * ar / (ar + comp):.0f}% of a synchronous step)")
    print("| mode | steps/s | ms/step | vs sync | vs DDP |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        if mode in best:
            s = best[mode]
            vs_ddp = f"{s[0] / best['ddp'][0]:.2f}x" if "ddp" in best else "-"
            print(f"| {mode} | {s[0]:.3f} | {s[1]:.1f} | {s[0] / sync[0]:.2f}x | {vs_ddp} |")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        report(list(csv.reader(f)), sys.argv[2])
