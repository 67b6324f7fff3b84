#!/usr/bin/env python3
"""Compile-fail harness: checks that misuse of the API is rejected at compile time.

Each snippet's first line is a directive:

  // expect-error: <regex>   the snippet must NOT compile, and the compiler's diagnostics
                             must match <regex> (Python `re.search`, multi-line text)
  // expect-error(N): <regex>  the same, and the diagnostics hold exactly N "error:" lines
                             (a misuse should cost the user one error, not a cascade)
  // expect-ok               the snippet must compile (a control, so that a broken include
                             path or compiler cannot make every expect-error pass)

Each snippet is compiled with `<cxx> -std=c++20 -fsyntax-only -I<include> [flags]` under
LC_ALL=C (so the compiler writes plain ASCII quotes). Snippets include the few headers they need
(fast against include/). With --single-header, every `#include <distribute/...>` line of the snippet
is replaced by `#include <distribute/distribute.hpp>` (a copy in a temporary directory is
compiled), so the same snippets check single_include/.

Usage:
  run_compile_fail.py --cxx g++ --include include [--single-header] [--flag=-DFOO ...] a.cpp b.cpp ...
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DIRECTIVE_RE = re.compile(r"^\s*//\s*expect-(error|ok)(?:\((\d+)\))?\s*(?::\s*(.*?))?\s*$")
ERROR_LINE_RE = re.compile(r"\berror:", re.M)


def parse_directive(path: Path) -> tuple[str, re.Pattern[str] | None, int | None]:
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    m = DIRECTIVE_RE.match(first)
    if not m:
        raise ValueError(
            f"{path}: first line must be '// expect-error: <regex>' or '// expect-ok', "
            f"got {first.rstrip()!r}")
    kind, count, regex = m.group(1), m.group(2), m.group(3)
    errors = int(count) if count is not None else None
    if kind == "error":
        if not regex:
            raise ValueError(f"{path}: '// expect-error:' needs a regex")
        try:
            return kind, re.compile(regex, re.M), errors
        except re.error as e:
            raise ValueError(f"{path}: bad regex {regex!r}: {e}") from None
    if regex or errors is not None:
        raise ValueError(f"{path}: '// expect-ok' takes no regex and no count")
    return kind, None, None


def indent(text: str, limit: int = 60) -> str:
    lines = text.rstrip().splitlines()
    shown = lines[:limit]
    if len(lines) > limit:
        shown.append(f"... ({len(lines) - limit} more lines)")
    return "\n".join("    | " + line for line in shown)


INCLUDE_RE = re.compile(r"^\s*#\s*include\s*<distribute/[^>]*>\s*$", re.M)


def as_single_header(snippet: Path, workdir: Path) -> Path:
    """A copy of `snippet` whose distribute includes are one include of the umbrella header."""
    text = snippet.read_text(encoding="utf-8")
    first = INCLUDE_RE.search(text)
    if first is None:
        raise ValueError(f"{snippet}: no #include <distribute/...> line to replace")
    text = text[:first.start()] + "#include <distribute/distribute.hpp>" + INCLUDE_RE.sub("", text[first.end():])
    out = workdir / snippet.name
    out.write_text(text, encoding="utf-8")
    return out


def run_one(cxx: list[str], include: str, flags: list[str], snippet: Path, workdir: Path | None) -> bool:
    try:
        kind, regex, errors = parse_directive(snippet)
        source = as_single_header(snippet, workdir) if workdir else snippet
    except (OSError, ValueError) as e:
        print(f"ERROR {snippet}: {e}")
        return False
    cmd = [*cxx, "-std=c++20", "-fsyntax-only", f"-I{include}", *flags, str(source)]
    env = dict(os.environ, LC_ALL="C", LANG="C")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    output = proc.stdout.decode("utf-8", errors="replace")
    name = f"{snippet.name} [-I{include}]"
    print(f"$ {shlex.join(cmd)}")

    if kind == "ok":
        if proc.returncode == 0:
            print(f"PASS  {name}: compiles, as expected")
            return True
        print(f"FAIL  {name}: expected to compile, but the compiler failed "
              f"(exit {proc.returncode}):\n{indent(output)}")
        return False

    assert regex is not None
    if proc.returncode == 0:
        print(f"FAIL  {name}: expected a compile error matching /{regex.pattern}/, "
              f"but it compiled" + (f":\n{indent(output)}" if output.strip() else ""))
        return False
    if not regex.search(output):
        print(f"FAIL  {name}: compile failed as expected, but no diagnostic matches "
              f"/{regex.pattern}/; the compiler said:\n{indent(output)}")
        return False
    found = len(ERROR_LINE_RE.findall(output))
    if errors is not None and found != errors:
        print(f"FAIL  {name}: expected exactly {errors} error(s), the compiler gave {found}:\n{indent(output)}")
        return False
    print(f"PASS  {name}: rejected with a diagnostic matching /{regex.pattern}/"
          + (f", {found} error(s)" if errors is not None else ""))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", required=True,
                        help="compiler command (split like a shell would, e.g. 'ccache g++')")
    parser.add_argument("--include", required=True, help="directory passed as -I")
    parser.add_argument("--single-header", action="store_true",
                        help="compile each snippet with its distribute includes replaced by <distribute/distribute.hpp>")
    parser.add_argument("--flag", action="append", default=[],
                        help="extra compiler flag (repeatable; write --flag=-DX)")
    parser.add_argument("snippets", nargs="+", type=Path)
    args = parser.parse_args(argv)

    cxx = shlex.split(args.cxx)
    if not cxx:
        parser.error("--cxx is empty")
    if not Path(args.include).is_dir():
        print(f"ERROR: include directory {args.include!r} does not exist")
        return 2

    with tempfile.TemporaryDirectory(prefix="compile-fail-") as tmp:
        workdir = Path(tmp) if args.single_header else None
        failed = [s for s in args.snippets if not run_one(cxx, args.include, args.flag, s, workdir)]
    total = len(args.snippets)
    print(f"{total - len(failed)}/{total} snippets behaved as expected")
    if failed:
        print("failed: " + ", ".join(str(s) for s in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
