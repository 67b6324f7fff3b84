#!/usr/bin/env python3
"""Picks tests of a configured meson build dir by suite, for the sanitizer sections of .ci/run.

  select_tests.py BUILDDIR --suite host --suite net [--skip-name single_include] --names
      the test names, one per line (for `meson test NAME...`)
  select_tests.py BUILDDIR ... --targets
      the ninja targets those tests need: their executables, helper programs named in their
      arguments or environment, and their `depends:`, relative to BUILDDIR

so that a sanitizer build compiles only what it runs."""
import argparse
import json
import os
import subprocess
import sys


def introspect(builddir: str, what: str):
    out = subprocess.run(["meson", "introspect", what, builddir], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("builddir")
    ap.add_argument("--suite", action="append", required=True)
    ap.add_argument("--skip-name", action="append", default=[], help="skip tests whose name contains this")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--names", action="store_true")
    mode.add_argument("--targets", action="store_true")
    args = ap.parse_args()

    build = os.path.realpath(args.builddir)
    tests = [t for t in introspect(build, "--tests")
             if any(s.split(":")[-1] in args.suite for s in t["suite"])
             and not any(skip in t["name"] for skip in args.skip_name)]
    if not tests:
        print(f"select_tests: no tests in suites {args.suite}", file=sys.stderr)
        return 1
    if args.names:
        for t in tests:
            print(t["name"])
        return 0

    files_of = {tgt["id"]: tgt["filename"] for tgt in introspect(build, "--targets")}
    wanted = set()

    def add(path: str):
        real = os.path.realpath(path)
        if real.startswith(build + os.sep) and not real.endswith(".py"):
            wanted.add(os.path.relpath(real, build))

    for t in tests:
        for word in t["cmd"]:
            add(word)
        for value in (t.get("env") or {}).values():
            add(value)
        for dep in t.get("depends", []):
            for f in files_of.get(dep, []):
                add(f)
    print(" ".join(sorted(wanted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
