#!/usr/bin/env python3
"""Prints, from the logs of .ci/run's sections, each failed or timed-out test and the end of its output.

  failure_summary.py [--lines N] [--tests M] [--frames F] SECTION_LOG...

CI keeps only the tail of a run's output, and the sanitizer and clang sections run after the long
first one: without this, a failure there is known only by its count. For every test that `meson test
--print-errorlogs` reports as FAIL, TIMEOUT or UNEXPECTEDPASS, this prints meson's result line, then
the last N lines (default 25) of the log meson printed under it, for the first M such tests (default
4); the result line of every further one is still printed. Prints nothing when no test failed.

A sanitizer's report is printed before that tail, but for its shadow-byte map, the deep frames of its
stacks (--frames, default 10), their addresses and binaries, and the end of long lines: the map is what
the tail of an ASan failure holds, the lines that say what went wrong, where, and who freed it come
before it, and CI keeps only about 12,000 characters.
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
# Where a sanitizer's report starts and ends ("==123==ERROR: AddressSanitizer: heap-use-after-free",
# "WARNING: ThreadSanitizer: data race", "x.cpp:3:5: runtime error: ...", "SUMMARY: ...").
REPORT_START = re.compile(r"==\d+==ERROR: \w+Sanitizer|WARNING: ThreadSanitizer:|: runtime error: ")
REPORT_END = re.compile(r"^\s*SUMMARY: \w+Sanitizer")
FRAME = re.compile(r"^\s*#(\d+) ")
# "    #2 0x55bc7e1 in f(int) (/path/to/binary+0x1459976)" -> "    #2 f(int)"
FRAME_NOISE = re.compile(r"^(\s*#\d+) 0x[0-9a-f]+ (?:in )?(.*?)(?: \(/[^()]*\+0x[0-9a-f]+\))?$")
REPORT_LINE_CHARS = 200
REPORT_CHARS = 7000
SHADOW_START = re.compile(r"Shadow bytes around the buggy address")
SHADOW_END = re.compile(r"==\d+==ABORTING")


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


def without_shadow_map(log: list[str]) -> list[str]:
    """The log without ASan's shadow-byte map and legend (kept: the ABORTING line that ends them)."""
    out: list[str] = []
    in_map = False
    for line in log:
        if SHADOW_START.search(line):
            in_map = True
            out.append("(ASan's shadow-byte map left out)")
        elif in_map and SHADOW_END.search(line):
            in_map = False
        if not in_map:
            out.append(line)
    return out


def split_reports(log: list[str], frames: int) -> tuple[list[str], list[str]]:
    """(each sanitizer report in the log, cut as the module's docstring says, REPORT_CHARS at most;
    the rest of the log, without the shadow-byte map)."""
    report: list[str] = []
    rest: list[str] = []
    in_report = False
    dropped = 0
    for line in without_shadow_map(log):
        if not in_report and REPORT_START.search(line):
            in_report = True
        if not in_report:
            rest.append(line)
            continue
        frame = FRAME.match(line)
        if frame and int(frame.group(1)) >= frames:
            dropped += 1
            continue
        if dropped:
            report.append(f"    ({dropped} deeper frames left out)")
            dropped = 0
        line = FRAME_NOISE.sub(r"\1 \2", line)
        report.append(line if len(line) <= REPORT_LINE_CHARS else line[:REPORT_LINE_CHARS - 3] + "...")
        if REPORT_END.search(line):
            in_report = False
    if dropped:
        report.append(f"    ({dropped} deeper frames left out)")
    total = 0
    for i, line in enumerate(report):
        total += len(line) + 1
        if total > REPORT_CHARS:
            return report[:i] + [f"(the reports go on for {len(report) - i} more lines)"], rest
    return report, rest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=25, help="lines of each failing test's log to print")
    ap.add_argument("--tests", type=int, default=4, help="failing tests whose log is printed")
    ap.add_argument("--frames", type=int, default=10, help="frames of each sanitizer stack to print")
    ap.add_argument("logs", nargs="+", type=Path)
    args = ap.parse_args()
    shown = 0
    for path in args.logs:
        for result, log in failures(path.read_text(encoding="utf-8", errors="replace")):
            print(f"-- {result}")
            if shown < args.tests:
                shown += 1
                report, rest = split_reports(log, args.frames)
                for line in report:
                    print(f"   | {line}")
                if report:
                    print("   | (the end of the rest of the log:)")
                tail = [line for line in rest if line.strip()][-args.lines:]
                for line in tail:
                    print(f"   | {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
