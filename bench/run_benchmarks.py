#!/usr/bin/env python3
"""Builds the host benchmarks (release) and runs them; prints the results as markdown tables.

    python3 bench/run_benchmarks.py                 # 3 rounds of everything, ~2 min on 2 vCPU
    python3 bench/run_benchmarks.py --rounds 1      # one quick round
    python3 bench/run_benchmarks.py --replicas 2,4  # the all-reduce also at 2 replicas
    python3 bench/run_benchmarks.py --only allreduce --json-dir /tmp/ar  # keep the raw JSON
    python3 bench/run_benchmarks.py --only input    # the input pipeline, with and without prefetch

Each round runs each benchmark binary once (a separate process), one after the other, so the
rounds sample the machine at different moments. A figure is the median over the rounds of the
per-iteration median (p50) of that round; "spread" is the lowest and highest round. The
all-reduce / memcpy ratio is taken within each round (the memcpy of the same size runs right
before the all-reduce) and then its median over the rounds. This is the command recorded in
docs/performance.md. Exits with status 1 if a benchmark reported an error (listed under
"Failures"; its run is left out of the tables).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"run": "bench_run_overhead", "allreduce": "bench_allreduce_host", "input": "bench_input_pipeline"}
FAILURES: list[str] = []  # benchmarks that reported an error or failed steps
RAW: list[list[dict]] = []  # every run as reported, errors included
RUN_OVERHEAD_TARGET_US = 10.0  # at 4 replicas
ALLREDUCE_RATIO_TARGET = 2.0  # 64 MiB all-reduce vs memcpy of the same total bytes


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def build(build_dir: Path) -> None:
    if not (build_dir / "build.ninja").exists():
        sh(["meson", "setup", str(build_dir), "--buildtype=release", "-Dtests=false", "-Dexamples=false"],
           cwd=ROOT, stdout=subprocess.DEVNULL)
    sh(["meson", "compile", "-C", str(build_dir), *TARGETS.values()], cwd=ROOT, stdout=subprocess.DEVNULL)


def machine() -> list[str]:
    def out(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "?"

    model = re.sub(r"^Model name:\s*", "", out("lscpu | grep 'Model name'"))
    rev = out(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null")
    if not rev:
        rev = "? (not a git checkout)"
    elif out(f"git -C {ROOT} status --porcelain --untracked-files=no -- include"):
        rev += " + uncommitted changes under include/"
    return [
        f"- CPU: {model}, nproc = {os.cpu_count()} ({out('nproc')} usable)",
        f"- Kernel: {platform.release()}; compiler: {out('c++ --version | head -1')}",
        f"- Google Benchmark {out('pkg-config --modversion benchmark')}; library at {rev}",
        f"- Load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def run_binary(path: Path, args: list[str], json_out: Path) -> list[dict]:
    cmd = [str(path), f"--benchmark_out={json_out}", "--benchmark_out_format=json", *args]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{path.name} failed with exit status {proc.returncode}")
    data = json.loads(json_out.read_text())
    runs = [b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    for b in runs:
        if b.get("error_occurred"):
            FAILURES.append(f"{path.name}: `{base_name(b['name'])}`: {b.get('error_message')}")
        elif b.get("failed_steps", 0) > 0:
            FAILURES.append(f"{path.name}: `{base_name(b['name'])}`: {b['failed_steps']:.0f} of {b['iterations']} "
                            f"steps threw")
    RAW.append(runs)
    return [b for b in runs if not b.get("error_occurred")]


def base_name(name: str) -> str:
    """Drops Google Benchmark's suffixes (min_time, iterations, real_time)."""
    return "/".join(p for p in name.split("/") if not re.match(r"(min_time|iterations|real_time|repeats)", p))


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_us(us: float) -> str:
    if us >= 10_000:
        return f"{us / 1000:.1f} ms"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    if us >= 100:
        return f"{us:.0f} µs"
    if us >= 10:
        return f"{us:.1f} µs"
    return f"{us:.2f} µs"


def fmt_bytes(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def spread(xs: list[float], f=fmt_us) -> str:
    return f"{f(min(xs))} – {f(max(xs))}" if len(xs) > 1 else "–"


def run_table(rounds: list[list[dict]]) -> tuple[list[str], dict]:
    by: dict[str, list[dict]] = {}
    for r in rounds:
        for b in r:
            by.setdefault(base_name(b["name"]), []).append(b)
    lines = [
        "| benchmark | µs/step, median (p50) | spread of p50 over rounds | mean µs/step | context switches/step "
        "| heap allocs/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for name, bs in by.items():
        p50 = [b["p50_us"] for b in bs]
        mean = [b["real_time"] for b in bs]  # Unit is µs in run_overhead.cpp
        allocs = med([b["allocs_per_iter"] for b in bs])
        switches = med([b.get("ctxsw_per_iter", float("nan")) for b in bs])
        summary[name] = med(p50)
        lines.append(f"| `{name}` | {med(p50):.2f} | {spread(p50, lambda x: f'{x:.2f}')} | {med(mean):.2f} | "
                     f"{switches:.1f} | {allocs:.2f} |")
    return lines, summary


def allreduce_table(rounds: list[list[dict]]) -> tuple[list[str], dict]:
    # key (bytes, replicas) -> {"memcpy": [...], policy: [...]} with one run per round
    cells: dict[tuple[int, int], dict[str, list[dict]]] = {}
    policies: list[str] = []
    for r in rounds:
        for b in r:
            m = re.match(r"^(memcpy|allreduce(_const|_into)?<([^>]*)>)/bytes:(\d+)/replicas:(\d+)", b["name"])
            if not m:
                continue
            how = {"_const": " (const lvalues)", "_into": " (const lvalues, into kept outputs)"}.get(m.group(2), "")
            kind = "memcpy" if m.group(1) == "memcpy" else m.group(3) + how
            if kind != "memcpy" and kind not in policies:
                policies.append(kind)
            cells.setdefault((int(m.group(4)), int(m.group(5))), {}).setdefault(kind, []).append(b)
    lines = [
        "| replicas | size per replica | policy | memcpy N×size (p50) | all-reduce (p50) | spread of all-reduce "
        "| algbw GB/s | busbw GB/s | all-reduce / memcpy | spread of ratio | heap allocs/iter |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for (size, n) in sorted(cells, key=lambda k: (k[1], k[0])):
        c = cells[(size, n)]
        mc = [b["p50_us"] for b in c.get("memcpy", [])]
        for pol in policies:
            if pol not in c:
                continue
            ar = [b["p50_us"] for b in c[pol]]
            ratios = [a / m for a, m in zip(ar, mc)] if mc else []
            algbw = size / (med(ar) * 1e-6) / 1e9
            busbw = algbw * 2 * (n - 1) / n
            allocs = med([b["allocs_per_iter"] for b in c[pol]])
            ratio = med(ratios) if ratios else float("nan")
            summary[(size, n, pol)] = ratio
            lines.append(
                f"| {n} | {fmt_bytes(size)} | {pol} | {fmt_us(med(mc)) if mc else '?'} | {fmt_us(med(ar))} | "
                f"{spread(ar)} | {algbw:.2f} | {busbw:.2f} | {ratio:.2f} | "
                f"{spread(ratios, lambda x: f'{x:.2f}')} | {allocs:.0f} |")
    return lines, summary


def input_table(rounds: list[list[dict]]) -> tuple[list[str], dict]:
    by: dict[str, list[dict]] = {}
    for r in rounds:
        for b in r:
            by.setdefault(base_name(b["name"]), []).append(b)
    lines = [
        "| benchmark | elements/s (median over rounds) | spread | p50 µs/step | spread of p50 | heap allocs/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for name, bs in by.items():
        eps = [b["elements_per_s"] for b in bs]
        p50 = [b["p50_us"] for b in bs]
        summary[name] = med(eps)
        lines.append(f"| `{name}` | {med(eps) / 1000:.1f} k | {spread(eps, lambda x: f'{x / 1000:.1f} k')} | "
                     f"{med(p50):.0f} | {spread(p50, lambda x: f'{x:.0f}')} | "
                     f"{med([b['allocs_per_iter'] for b in bs]):.0f} |")
    return lines, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build-bench", help="meson build directory (release); default build-bench")
    ap.add_argument("--rounds", type=int, default=3, help="separate runs of each binary (default 3)")
    ap.add_argument("--only", choices=sorted(TARGETS), help="run only one of the benchmark binaries")
    ap.add_argument("--replicas", default="4", help="replica counts for the all-reduce, e.g. 2,4 (default 4)")
    ap.add_argument("--filter", help="--benchmark_filter passed to every binary")
    ap.add_argument("--json-dir", help="keep the raw Google Benchmark JSON files here")
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    a = ap.parse_args()

    build_dir = (ROOT / a.build_dir).resolve()
    if not a.no_build:
        if shutil.which("meson") is None:
            raise SystemExit("meson not found (scripts/install-deps.sh installs it)")
        build(build_dir)
    exe = {k: build_dir / "bench" / v for k, v in TARGETS.items()}
    for k, p in exe.items():
        if (a.only in (None, k)) and not p.exists():
            raise SystemExit(f"{p} was not built: is libbenchmark-dev installed? (scripts/install-deps.sh)")

    json_dir = Path(a.json_dir) if a.json_dir else Path(tempfile.mkdtemp(prefix="ds-bench-"))
    json_dir.mkdir(parents=True, exist_ok=True)
    header = machine()
    extra = [f"--benchmark_filter={a.filter}"] if a.filter else []
    results: dict[str, list[list[dict]]] = {k: [] for k in TARGETS}
    t0 = time.monotonic()
    for i in range(a.rounds):
        for k in TARGETS:
            if a.only not in (None, k):
                continue
            args = list(extra)
            if k == "allreduce":
                args.append(f"--replicas={a.replicas}")
            results[k].append(run_binary(exe[k], args, json_dir / f"{k}-round{i + 1}.json"))
    elapsed = time.monotonic() - t0

    out = ["## Machine", *header,
           f"- {a.rounds} round(s), {elapsed:.0f} s in all; raw JSON in `{json_dir}`", ""]
    verdicts = []
    if results["run"]:
        lines, s = run_table(results["run"])
        out += ["## strategy.run() overhead (empty step)", *lines, ""]
        key = "run/MirroredStrategy/replicas:4"
        if key in s:
            ok = s[key] <= RUN_OVERHEAD_TARGET_US
            verdicts.append(f"- run() at 4 replicas: {s[key]:.2f} µs/step (p50) — target ≤ {RUN_OVERHEAD_TARGET_US:g} "
                            f"µs: {'met' if ok else 'NOT met'}")
    if results["allreduce"]:
        lines, s = allreduce_table(results["allreduce"])
        out += ["## All-reduce (float32 SUM, in process) vs memcpy of the same total bytes", *lines, ""]
        for (size, n, pol), ratio in s.items():
            if size == 64 << 20 and n == 4:
                ok = ratio <= ALLREDUCE_RATIO_TARGET
                verdicts.append(f"- 64 MiB all-reduce, 4 replicas, {pol}: {ratio:.2f}× memcpy — target ≤ "
                                f"{ALLREDUCE_RATIO_TARGET:g}×: {'met' if ok else 'NOT met'}")
    if results["input"]:
        lines, s = input_table(results["input"])
        out += ["## Input pipeline (8 CSV files -> parse -> batch(256), a step that sleeps)", *lines, ""]
        for step in (500, 2000):
            off, on = s.get(f"pipeline/prefetch:0/step_us:{step}"), s.get(f"pipeline/prefetch:2/step_us:{step}")
            if off and on:
                verdicts.append(f"- input pipeline, {step} µs step: prefetch(2) gives {on / off:.2f}× the elements/s "
                                f"of no prefetch")
    if verdicts:
        out += ["## Targets", *verdicts, ""]
    if FAILURES:
        out += ["## Failures (a run that reported an error is left out of the tables; steps that threw are "
                "counted in the run they belong to)", *(f"- {f}" for f in FAILURES), ""]
    print("\n".join(out))
    return 1 if any(b.get("error_occurred") for rs in RAW for b in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
