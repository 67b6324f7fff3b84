#!/usr/bin/env python3
"""Prints, from the logs of .ci/run's sections, each failed or timed-out test and the end of its output.

  failure_summary.py [--lines N] [--tests M] SECTION_LOG...

CI keeps only the tail of a run's output, and the sanitizer and clang sections run after the long
first one: without this, a failure there is known only by its count. For every test that `meson test
--print-errorlogs` reports as FAIL, TIMEOUT or UNEXPECTEDPASS, this prints meson's result line, then
the last N lines (default 25) of the log meson printed under it, for the first M such tests (default
4); the result line of every further one is still printed. Prints nothing when no test failed.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# " 3/12 distribute:net / net   TIMEOUT   300.02s   killed by signal 15 SIGTERM"
RESULT = re.compile(r"^\s*\d+/\d+\s+.*\s(FAIL|TIMEOUT|UNEXPECTEDPASS)\s+\d+\.\d+s")
# meson frames each error log with rules of U+2015; the opening one carries a scissors mark.
RULE = "\u2015" * 10


def failures(text: str) -> list[tuple[str, list[str]]]:
    """(result line, log lines) for each failing test, in the order meson printed them. The repeat
    in meson's "Summary of Failures" has no log under it and is skipped."""
    found: list[tuple[str, list[str]]] = []
    lines = ANSI.sub("", text).splitlines()
    in_summary = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "Summary of Failures:":
            in_summary = True
        elif line.startswith("Ok:"):
            in_summary = False
        elif not in_summary and RESULT.match(line):
            log: list[str] = []
            j = i + 1
            if j < len(lines) and lines[j].startswith(">>> "):
                j += 1
            if j < len(lines) and RULE in lines[j]:
                j += 1
                while j < len(lines) and RULE not in lines[j]:
                    log.append(lines[j])
                    j += 1
                i = j
            found.append((line.strip(), log))
        i += 1
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=25, help="lines of each failing test's log to print")
    ap.add_argument("--tests", type=int, default=4, help="failing tests whose log is printed")
    ap.add_argument("logs", nargs="+", type=Path)
    args = ap.parse_args()
    shown = 0
    for path in args.logs:
        for result, log in failures(path.read_text(encoding="utf-8", errors="replace")):
            print(f"-- {result}")
            if shown < args.tests:
                shown += 1
                tail = [line for line in log if line.strip()][-args.lines:]
                for line in tail:
                    print(f"   | {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
