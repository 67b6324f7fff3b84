#!/usr/bin/env python3
"""What including the library costs a translation unit: compile time and peak compiler memory.

Compiles, in one run and interleaved (this machine is shared and noisy), the README's minimal
program through the single header, a MultiWorkerMirrored program, and a nlohmann/json hello world
(the yardstick: a popular header-only library), each at -O0 and -O2, to an object file (-c: what
every translation unit of a user's project pays; linking is once per program). The two programs
are compiled twice: header-only (the default) and compiled apart (-DDISTRIBUTE_SEPARATE_COMPILATION:
the program's file sees declarations), and the library's own file of a program compiled apart
(<distribute/src.hpp>, compiled once per program) is measured too. Wall time and peak memory come
from `/usr/bin/time -v`; each figure is the median of --repeat runs, and the ratio is to the
yardstick at the same optimisation level, measured in the same run.

  python3 bench/compile_cost.py [--cxx g++] [--include single_include] [--repeat 3] [--flag=-DX ...]
                                [--only minimal ...]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SEPARATE = ["-DDISTRIBUTE_SEPARATE_COMPILATION"]
PROGRAMS = [  # (label, source, needs the library's include path, extra flags)
    ("minimal (README)", HERE / "compile_cost" / "minimal.cpp", True, []),
    ("minimal (README), compiled apart", HERE / "compile_cost" / "minimal.cpp", True, SEPARATE),
    ("MultiWorkerMirrored", HERE / "compile_cost" / "multi_worker.cpp", True, []),
    ("MultiWorkerMirrored, compiled apart", HERE / "compile_cost" / "multi_worker.cpp", True, SEPARATE),
    ("the library's file (once per program)", HERE / "compile_cost" / "library.cpp", True, SEPARATE),
    ("nlohmann/json hello (yardstick)", HERE / "compile_cost" / "json_hello.cpp", False, []),
]
LEVELS = ["-O0", "-O2"]
# The targets, at -O2: the minimal program at most 1.5x the yardstick and under 500 MB;
# the MultiWorkerMirrored program at most 3x the yardstick. They are checked on each way of
# compiling a program's files (header-only and compiled apart).
TARGETS = {"minimal (README)": (1.5, 500.0), "minimal (README), compiled apart": (1.5, 500.0),
           "MultiWorkerMirrored": (3.0, None), "MultiWorkerMirrored, compiled apart": (3.0, None)}

WALL_RE = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\):\s*(?:(\d+):)?(\d+):([\d.]+)")
RSS_RE = re.compile(r"Maximum resident set size \(kbytes\):\s*(\d+)")


def compile_once(cxx: list[str], level: str, source: Path, include: str | None, flags: list[str],
                 out: Path) -> tuple[float, float]:
    """One compile under /usr/bin/time -v: (wall seconds, peak MB)."""
    cmd = ["/usr/bin/time", "-v", *cxx, "-std=c++20", level, *flags]
    if include:
        cmd.append(f"-I{include}")
    cmd += ["-c", str(source), "-o", str(out)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, LC_ALL="C"))
    if proc.returncode != 0:
        sys.exit(f"compile_cost: this command failed (exit {proc.returncode}):\n  {shlex.join(cmd[2:])}\n"
                 + proc.stderr[-4000:])
    wall, rss = WALL_RE.search(proc.stderr), RSS_RE.search(proc.stderr)
    if not wall or not rss:
        sys.exit("compile_cost: cannot read /usr/bin/time -v's report:\n" + proc.stderr[-2000:])
    hours = float(wall.group(1) or 0)
    seconds = hours * 3600 + float(wall.group(2)) * 60 + float(wall.group(3))
    return seconds, int(rss.group(1)) / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="compiler command (default: $CXX or g++)")
    parser.add_argument("--include", default=str(ROOT / "single_include"),
                        help="the library's include directory (default: single_include/)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each compile; the median is reported")
    parser.add_argument("--flag", action="append", default=[], help="extra compiler flag (write --flag=-DX)")
    parser.add_argument("--only", action="append", default=[],
                        help="measure only the programs whose label contains this text (repeatable; the "
                             "yardstick is always measured)")
    args = parser.parse_args()
    programs = [p for p in PROGRAMS if p is PROGRAMS[-1] or not args.only or any(o in p[0] for o in args.only)]
    if not Path("/usr/bin/time").exists():
        sys.exit("compile_cost: /usr/bin/time is missing (Debian package 'time')")
    if args.repeat < 1:
        sys.exit("compile_cost: --repeat must be at least 1")
    cxx = shlex.split(args.cxx)
    if not cxx or shutil.which(cxx[0]) is None:
        sys.exit(f"compile_cost: compiler {args.cxx!r} not found")
    version = subprocess.run([*cxx, "--version"], stdout=subprocess.PIPE, text=True).stdout.splitlines()[0]

    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="compile-cost-") as tmp:
        out = Path(tmp) / "a.o"
        for run in range(args.repeat):
            for level in LEVELS:
                for label, source, needs_include, flags in programs:
                    wall, mb = compile_once(cxx, level, source, args.include if needs_include else None,
                                            [*flags, *args.flag], out)
                    samples.setdefault((label, level), []).append((wall, mb))
                    print(f"  run {run + 1}/{args.repeat} {level} {label}: {wall:.2f} s, {mb:.0f} MB",
                          file=sys.stderr, flush=True)

    def median(label: str, level: str) -> tuple[float, float]:
        runs = samples[(label, level)]
        return statistics.median(w for w, _ in runs), statistics.median(m for _, m in runs)

    yardstick = PROGRAMS[-1][0]
    print(f"compiler: {version}; include: {args.include}; flags: {' '.join(args.flag) or '(none)'}; "
          f"median of {args.repeat}")
    print()
    print("| program | level | wall s | peak MB | × yardstick (time) | target at -O2 |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    missed = []
    for label, _, _, _ in programs:
        for level in LEVELS:
            wall, mb = median(label, level)
            ratio = wall / median(yardstick, level)[0]
            target = ""
            if level == "-O2" and label in TARGETS:
                max_ratio, max_mb = TARGETS[label]
                ok = ratio <= max_ratio and (max_mb is None or mb < max_mb)
                target = f"≤ {max_ratio}×" + (f", < {max_mb:.0f} MB" if max_mb else "") + (": met" if ok else ": MISSED")
                if not ok:
                    missed.append(label)
            print(f"| {label} | {level} | {wall:.2f} | {mb:.0f} | {ratio:.2f} | {target} |")
    if missed:
        print(f"\ntargets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
