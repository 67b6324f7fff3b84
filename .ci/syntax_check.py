#!/usr/bin/env python3
"""Compiles every C++ source of a configured meson build dir that was not built, with -fsyntax-only.

  syntax_check.py BUILDDIR [--built-in OTHER_BUILDDIR]... [--jobs N]

For the clang section of .ci/run: the suites it runs are built and linked; every other program
(tests, helpers, examples, benchmarks) goes through the compiler's front end with its own flags
from compile_commands.json, which is where the two compilers disagree (name lookup, templates,
constraints), at about half the cost of generating code nobody runs. A source whose object file
exists was compiled for real and is skipped, in BUILDDIR or in another build of the same compiler
named by --built-in (.ci/run's sanitized clang builds; a unity file there counts when it includes the
same sources). Exits 1 if any source fails, after printing its
diagnostics."""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import time

# Options that only matter when an object file is written: dropped with their argument, if any.
WITH_ARGUMENT = {"-o", "-MQ", "-MF", "-MT"}
ALONE = {"-c", "-MD", "-MMD"}


def syntax_only(command: str) -> list[str]:
    words, out, skip = shlex.split(command), [], False
    for w in words:
        if skip:
            skip = False
        elif w in WITH_ARGUMENT:
            skip = True
        elif w not in ALONE:
            out.append(w)
    return [*out, "-fsyntax-only"]


def source_key(entry, builddir: str):
    """What names a source across build dirs: its path, or for a file meson generated in the build dir
    (a unity file, which includes a program's sources) its path there and the files it includes."""
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    root = os.path.realpath(builddir)
    if path.startswith(root + os.sep):
        with open(path, encoding="utf-8") as f:
            included = tuple(os.path.realpath(m) for m in re.findall(r'^#include\s*[<"](.+)[>"]\s*$', f.read(), re.M))
        return os.path.relpath(path, root), included
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("builddir")
    ap.add_argument("--built-in", action="append", default=[], metavar="BUILDDIR",
                    help="another build dir whose compiled sources count as compiled (repeatable)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    compiled = set()
    for other in args.built_in:
        with open(os.path.join(other, "compile_commands.json"), encoding="utf-8") as f:
            for e in json.load(f):
                if os.path.exists(os.path.join(e["directory"], e["output"])):
                    compiled.add(source_key(e, other))
    with open(os.path.join(args.builddir, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    todo = []
    for e in entries:
        if not e["file"].endswith((".cpp", ".cc", ".cxx")):
            continue  # CUDA sources are nvcc's
        obj = os.path.join(e["directory"], e["output"])
        if not os.path.exists(obj) and source_key(e, args.builddir) not in compiled:
            todo.append(e)
    built_in = " or ".join([args.builddir, *args.built_in])
    print(f"syntax_check: {len(todo)} sources not built in {built_in}, {args.jobs} at a time", flush=True)

    def check(e):
        start = time.monotonic()
        r = subprocess.run(syntax_only(e["command"]), cwd=e["directory"], capture_output=True, text=True)
        return e["file"], r.returncode, r.stdout + r.stderr, time.monotonic() - start

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for i, (name, rc, text, secs) in enumerate(pool.map(check, todo), 1):
            print(f"[{i}/{len(todo)}] {'ok  ' if rc == 0 else 'FAIL'} {os.path.relpath(name, args.builddir)} "
                  f"({secs:.0f} s)", flush=True)
            if rc:
                failed += 1
                print(text[:8000], flush=True)
    print(f"syntax_check: {len(todo) - failed} of {len(todo)} sources compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
