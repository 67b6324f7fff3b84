#!/usr/bin/env python3
"""Builds single_include/distribute/distribute.hpp from include/distribute/distribute.hpp.

The adapters (include/distribute/adapters/*.hpp, not part of the umbrella) and src.hpp (the
translation unit of DISTRIBUTE_SEPARATE_COMPILATION, version.hpp) are written beside it, as
single_include/distribute/adapters/*.hpp and single_include/distribute/src.hpp, with their includes
of the library's headers replaced by one include of the single header (every library header they
use must be part of it); an adapter's include of another adapter stays as it is.

Every `#include <distribute/...>` (or "distribute/...") is replaced, recursively, by the
text of that header; every other include is left where it is. `#pragma once` lines of
the inlined headers are dropped (each gets a generated include guard instead).

Each header's text is emitted once, like `#pragma once` would, inside a generated include
guard. A header whose first inclusion sits inside a preprocessor conditional (for example
the umbrella's `#if defined(DISTRIBUTE_DETAIL_PART_PS)` block) is inlined again (under the
same guard) wherever it is included later, so it is still there when that first conditional
was false; but not where the later include sits inside every conditional block that held an
earlier copy (the same branch of each, still open): that copy is compiled whenever the later
include would be. A header first reached unconditionally is emitted once and later includes
are dropped. The umbrella's own text has no guard and the amalgamation no `#pragma once`, as
the umbrella has none: including the single header again after defining a part's switch
(DISTRIBUTE_WITH_PS, ...) adds that part, and the guards keep everything else to one
definition.

Usage:
  python3 tools/amalgamate.py            # (re)write the single header
  python3 tools/amalgamate.py --check    # exit 1 if the checked-in file is stale

Python 3 standard library only; the output is deterministic.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

UMBRELLA = "distribute/distribute.hpp"
OUTPUT = Path("single_include") / UMBRELLA
STALE_MESSAGE = f"{OUTPUT.as_posix()} is stale; run python3 tools/amalgamate.py"

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"](distribute/[^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")
IF_RE = re.compile(r"^\s*#\s*(if|ifdef|ifndef)\b")
ELSE_RE = re.compile(r"^\s*#\s*(else|elif|elifdef|elifndef)\b")
ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
VERSION_RE = re.compile(r'^\s*#\s*define\s+DISTRIBUTE_VERSION_STRING\s+"([^"]*)"', re.M)


class AmalgamateError(Exception):
    pass


class Amalgamator:
    def __init__(self, include_dir: Path) -> None:
        self.include_dir = include_dir
        self.stack: list[str] = []
        # The conditional blocks open at this point of the output, innermost last (each branch
        # of an #if/#else has its own number), and where each copy of a header sits: a copy at
        # () was reached unconditionally.
        self.blocks: list[int] = []
        self.next_block = 0
        self.copies: dict[str, list[tuple[int, ...]]] = {}

    @staticmethod
    def guard_name(header: str) -> str:
        return "DISTRIBUTE_AMALGAMATED_" + re.sub(r"[^0-9A-Za-z]", "_", header).upper()

    def read(self, header: str, included_from: str | None) -> list[str]:
        path = self.include_dir / header
        if not path.is_file():
            where = f" (included from {included_from})" if included_from else ""
            raise AmalgamateError(f"cannot find <{header}>{where} under {self.include_dir}")
        return path.read_text(encoding="utf-8").splitlines()

    def expand(self, header: str, included_from: str | None) -> list[str]:
        """Returns the lines that replace `#include <header>`."""
        if header in self.stack:  # an include cycle: #pragma once would make it a no-op
            return []
        here = tuple(self.blocks)
        if any(here[: len(c)] == c for c in self.copies.get(header, [])):
            return []  # inside every block around an earlier copy: compiled whenever this would be
        # Never inlined, or only inside blocks that may have been false: inline it here; the
        # guard keeps it to one definition. The guard is no block of its own: a copy whose guard
        # is skipped was compiled before, with everything it includes unconditionally.
        lines = self.read(header, included_from)
        guarded = header != UMBRELLA  # the umbrella may be included again (see above)
        self.copies.setdefault(header, []).append(here)
        self.stack.append(header)
        try:
            body = self.expand_lines(lines, header)
        finally:
            self.stack.pop()
        out = [f"// ---- begin <{header}> ----"]
        if guarded:
            guard = self.guard_name(header)
            out += [f"#ifndef {guard}", f"#define {guard}"]
        out += body
        if guarded:
            out.append(f"#endif  // {self.guard_name(header)}")
        out.append(f"// ---- end <{header}> ----")
        return out

    def expand_lines(self, lines: list[str], header: str) -> list[str]:
        out: list[str] = []
        depth = 0  # #if nesting inside this file
        for line in lines:
            if PRAGMA_ONCE_RE.match(line):
                continue
            m = INCLUDE_RE.match(line)
            if m:
                out += self.expand(m.group(1), header)
                continue
            if IF_RE.match(line):
                depth += 1
                self.open_block()
            elif ELSE_RE.match(line) and depth > 0:
                self.blocks.pop()
                self.open_block()
            elif ENDIF_RE.match(line) and depth > 0:
                depth -= 1
                self.blocks.pop()
            out.append(line)
        return out

    def open_block(self) -> None:
        self.blocks.append(self.next_block)
        self.next_block += 1


def read_version(include_dir: Path) -> str:
    version_hpp = include_dir / "distribute" / "version.hpp"
    try:
        m = VERSION_RE.search(version_hpp.read_text(encoding="utf-8"))
    except FileNotFoundError:
        m = None
    if not m:
        raise AmalgamateError(f"no DISTRIBUTE_VERSION_STRING in {version_hpp}")
    return m.group(1)


BANNER = [
    "// SPDX-License-Identifier: Apache-2.0",
    "//",
    "// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by",
    "//   python3 tools/amalgamate.py",
    "// Edit the headers under include/ and regenerate.",
]


def generate(root: Path) -> dict[Path, str]:
    """The generated files: the single header, then one file per adapter."""
    include_dir = root / "include"
    version = read_version(include_dir)
    amalgamator = Amalgamator(include_dir)
    body = amalgamator.expand(UMBRELLA, included_from=None)
    banner = [f"// distribute {version}: tf.distribute for C++, single-header edition."] + BANNER + [""]
    out = {OUTPUT: "\n".join(banner + body) + "\n"}
    beside = sorted((include_dir / "distribute" / "adapters").glob("*.hpp")) + [include_dir / "distribute" / "src.hpp"]
    for adapter in beside:
        rel = adapter.relative_to(include_dir).as_posix()
        lines: list[str] = []
        included = False
        for line in adapter.read_text(encoding="utf-8").splitlines():
            m = INCLUDE_RE.match(line)
            if m and m.group(1).startswith("distribute/adapters/"):
                lines.append(line)  # another adapter: written beside this one, included as it is
                continue
            if m:
                if m.group(1) not in amalgamator.copies:
                    raise AmalgamateError(f"<{rel}> includes <{m.group(1)}>, which the single header does not hold")
                if not included:
                    lines.append(f"#include <{UMBRELLA}>")
                    included = True
                continue
            lines.append(line)
        header = [f"// distribute {version}: <{rel}> for the single-header edition."] + BANNER
        out[Path("single_include") / rel] = "\n".join(header + lines) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    default_root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=default_root,
                        help=f"repository root (default: {default_root})")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the checked-in file is stale")
    args = parser.parse_args(argv)

    root = args.root.resolve()
    try:
        files = generate(root)
    except AmalgamateError as e:
        print(f"amalgamate.py: error: {e}", file=sys.stderr)
        return 2

    if args.check:
        stale = False
        for rel, text in files.items():
            try:
                current = (root / rel).read_text(encoding="utf-8")
            except FileNotFoundError:
                print(f"{rel.as_posix()} is stale; run python3 tools/amalgamate.py (the file does not exist)",
                      file=sys.stderr)
                stale = True
                continue
            if current != text:
                diff = list(difflib.unified_diff(
                    current.splitlines(), text.splitlines(),
                    fromfile=f"{rel.as_posix()} (checked in)",
                    tofile=f"{rel.as_posix()} (generated)", lineterm="", n=1))
                shown = diff[:40]
                print("\n".join(shown), file=sys.stderr)
                if len(diff) > len(shown):
                    print(f"... ({len(diff) - len(shown)} more diff lines)", file=sys.stderr)
                print(f"{rel.as_posix()} is stale; run python3 tools/amalgamate.py", file=sys.stderr)
                stale = True
        if stale:
            return 1
        print(f"{OUTPUT.as_posix()} (and the {len(files) - 1} files beside it) are up to date")
        return 0

    for rel, text in files.items():
        out_path = root / rel
        out_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            unchanged = out_path.read_text(encoding="utf-8") == text
        except FileNotFoundError:
            unchanged = False
        if unchanged:
            print(f"{rel.as_posix()} is up to date")
        else:
            with open(out_path, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            print(f"wrote {rel.as_posix()} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
