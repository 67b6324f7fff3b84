#!/usr/bin/env python3
"""Compiles, links and runs every compile line of README.md and docs/ with the program it builds.

The convention the documents follow (and this script enforces):

  * A compile line is a command that starts with g++, c++, clang++ or mpicxx (MPI's wrapper): an inline code span
    (`g++ -std=c++20 ... first.cpp -lfmt -pthread`) or a line of a fenced block (a trailing
    backslash continues it on the next line).
  * It names the program it builds, NAME.cpp (or the program's several files, MAIN.cpp OTHER.cpp),
    and somewhere in README.md or docs/ a fenced code block is marked as each file by an HTML
    comment on the line above its fence:
        <!-- file: NAME.cpp -->
    with optional settings after ';':  args: ARGS  (the program's arguments when it is run;
    {tmp} is the temporary directory)  and  norun  (compile and link only). File names are
    unique across the documents, so a line in one document may build a program shown in another.

Every (compile line, program) pair is built in a fresh temporary directory holding the line's
NAME.cpp files and the names the lines use for the repository's headers: single_include/,
include/ and path/to/single_include/. The line runs as written (with --cxx, its compiler word is
replaced); it must compile and link; a program with a main() (in its first file) then runs (with no
TF_CONFIG or launcher variables, so a multi-worker program is a one-worker job) and must exit 0
within 120 s. Lines that build the same programs with the same words (path/to/single_include being
single_include) are built and run once, and each reports the outcome.

A line whose prerequisites are missing here is skipped, with the reason: an absolute -I/-isystem
directory that does not exist, a -lNAME that does not link, or a header that is not distribute's
reported missing by the compiler. A line that names no NAME.cpp, or a NAME.cpp with no marked
block, is a failure.

Exit status: 0 when every line passed or was skipped (at least one passed), 1 when one failed,
77 (meson's "skipped") when every line was skipped.

Usage: check_compile_lines.py [--root REPO] [--cxx COMMAND] [--jobs N] [--list] [--keep] [--doc FILE.md]...
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from compile_once_more import run_compile  # noqa: E402

EXIT_SKIPPED = 77
COMPILERS = ("g++", "c++", "clang++", "mpicxx")
RUN_TIMEOUT = 120
COMPILE_TIMEOUT = 600

FENCE_RE = re.compile(r"^([ \t]*)(```+|~~~+)([^\n]*)\n(.*?)^\1\2[ \t]*$", re.S | re.M)
# A file marker: the last thing before a fence (only blank space between them).
MARKER_RE = re.compile(r"<!--[ \t]*file:[ \t]*([^\s;>]+)[ \t]*(?:;([^\n]*?))?[ \t]*-->\s*$")
SPAN_RE = re.compile(r"`([^`\n]+)`")
SOURCE_RE = re.compile(r"^[\w./-]+\.(?:cpp|cc|cxx)$")
MISSING_HEADER_RE = re.compile(r"fatal error: ([^\s:]+): No such file or directory|"
                               r"fatal error: '([^']+)' file not found")
# Variables that would make a documented program join a cluster instead of running alone.
CLUSTER_VARIABLES = ("TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT", "DISTRIBUTE_LAUNCH_TASK", "DISTRIBUTE_CLUSTER_TOKEN", "SLURM_PROCID",
                     "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclass
class Program:
    name: str
    code: str
    where: str
    args: list[str] = field(default_factory=list)
    run: bool = True


@dataclass
class Line:
    command: str
    where: str


@dataclass
class Outcome:
    line: Line
    status: str  # PASS, FAIL, SKIP
    detail: str


def documents(root: Path) -> list[Path]:
    docs = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [d for d in docs if d.is_file()]


def line_number(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def is_compile_command(text: str) -> bool:
    words = text.split(None, 1)
    return bool(words) and words[0] in COMPILERS and len(words) > 1


def scan(root: Path, docs: list[Path]) -> tuple[dict[str, Program], list[Line], list[str]]:
    """The marked programs, the compile lines and the errors in the convention."""
    programs: dict[str, Program] = {}
    lines: list[Line] = []
    errors: list[str] = []
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        rel = doc.relative_to(root).as_posix() if doc.is_relative_to(root) else doc.as_posix()
        prose_parts = []
        last = 0
        for fence in FENCE_RE.finditer(text):
            prose_parts.append((last, text[last:fence.start()]))
            last = fence.end()
            body = textwrap.dedent(fence.group(4))
            where = f"{rel}:{line_number(text, fence.start())}"
            marker = MARKER_RE.search(text[max(0, fence.start() - 500):fence.start()])
            if marker:
                name, settings = marker.group(1), marker.group(2) or ""
                program = Program(name, body, where)
                for setting in filter(None, (s.strip() for s in settings.split(";"))):
                    if setting == "norun":
                        program.run = False
                    elif setting.startswith("args:"):
                        program.args = shlex.split(setting[len("args:"):])
                    else:
                        errors.append(f"{where}: unknown setting {setting!r} in the file marker of {name}")
                if name in programs:
                    errors.append(f"{where}: {name} is marked twice (also at {programs[name].where}); "
                                  f"file names must be unique across README.md and docs/")
                else:
                    programs[name] = program
                continue
            # Compile lines inside a (shell) block; a trailing backslash continues a line.
            first_line = line_number(text, fence.start(4))
            pending, start = "", 0
            for k, raw in enumerate(body.split("\n")):
                if not pending:
                    start = first_line + k
                stripped = raw.strip()
                if stripped.endswith("\\"):
                    pending += stripped[:-1].strip() + " "
                    continue
                command, pending = (pending + stripped).strip(), ""
                if command.startswith("$ "):
                    command = command[2:].strip()
                command = re.sub(r"\s+#.*$", "", command)  # a trailing shell comment
                if is_compile_command(command):
                    lines.append(Line(command, f"{rel}:{start}"))
        prose_parts.append((last, text[last:]))
        for offset, prose in prose_parts:
            for span in SPAN_RE.finditer(prose):
                if is_compile_command(span.group(1)):
                    lines.append(Line(span.group(1).strip(), f"{rel}:{line_number(text, offset + span.start())}"))
    return programs, lines, errors


class Checker:
    def __init__(self, root: Path, cxx: list[str] | None, work: Path) -> None:
        self.root = root
        self.cxx = cxx
        self.work = work
        self.lib_cache: dict[str, bool] = {}

    def words(self, line: Line) -> list[str]:
        words = shlex.split(line.command)
        if self.cxx:
            words = [*self.cxx, *words[1:]]
        return words

    def library_links(self, compiler: list[str], flag: str) -> bool:
        key = " ".join(compiler) + " " + flag
        if key not in self.lib_cache:
            probe = subprocess.run([*compiler, "-x", "c++", "-", "-o", os.devnull, flag],
                                   input=b"int main() { return 0; }\n", stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            self.lib_cache[key] = probe.returncode == 0
        return self.lib_cache[key]

    def missing_prerequisite(self, words: list[str]) -> str | None:
        compiler = [w for w in words[:1]] if not self.cxx else list(self.cxx)
        if shutil.which(compiler[-1] if len(compiler) > 1 and Path(compiler[0]).name == "ccache"
                        else compiler[0]) is None:
            return f"the compiler {compiler[0]} is not installed"
        for k, w in enumerate(words):
            directory = None
            if w in ("-I", "-isystem") and k + 1 < len(words):
                directory = words[k + 1]
            elif w.startswith("-I") and len(w) > 2:
                directory = w[2:]
            if directory and os.path.isabs(directory) and not os.path.isdir(directory):
                return f"{directory} does not exist"
            if w.startswith("-l") and len(w) > 2 and not self.library_links(compiler, w):
                return f"{w} does not link here"
        return None

    def check(self, line: Line, files: list[Program], index: int) -> Outcome:
        words = self.words(line)
        missing = self.missing_prerequisite(words)
        if missing:
            return Outcome(line, "SKIP", missing)
        program = files[0]  # the one whose main() runs; the others are compiled and linked with it
        tmp = self.work / f"{index:02d}-{Path(program.name).stem}"
        tmp.mkdir(parents=True)
        for f in files:
            (tmp / f.name).write_text(f.code, encoding="utf-8")
        for name in ("single_include", "include"):
            (tmp / name).symlink_to(self.root / name, target_is_directory=True)
        (tmp / "path" / "to").mkdir(parents=True)
        (tmp / "path" / "to" / "single_include").symlink_to(self.root / "single_include", target_is_directory=True)
        if "-o" in words:
            exe = tmp / words[words.index("-o") + 1]
        else:
            exe = tmp / "a.out"
        print(f"[{line.where}] $ {shlex.join(words)}   # {program.name} from {program.where}", flush=True)
        try:
            proc, second = run_compile(words, cwd=tmp, timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            return Outcome(line, "FAIL", f"compiling {program.name} took longer than {COMPILE_TIMEOUT} s")
        out = proc.stdout.decode("utf-8", errors="replace")
        retried = (f" (the first try failed with g++'s spurious concept failure; the second built it)"
                   if second and proc.returncode == 0 else "")
        if proc.returncode != 0:
            for m in MISSING_HEADER_RE.finditer(out):
                header = m.group(1) or m.group(2)
                if not header.startswith("distribute/"):
                    return Outcome(line, "SKIP", f"<{header}> is not installed here")
            return Outcome(line, "FAIL", f"{program.name} does not build with this line:\n{out[-6000:]}")
        if not program.run or not re.search(r"\bint\s+main\s*\(", program.code):
            return Outcome(line, "PASS", f"{program.name} built (not run: "
                                         f"{'norun' if not program.run else 'no main()'}){retried}")
        args = [a.replace("{tmp}", str(tmp)) for a in program.args]
        env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
        try:
            run = subprocess.run([str(exe), *args], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=RUN_TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            return Outcome(line, "FAIL", f"{program.name} ran longer than {RUN_TIMEOUT} s")
        run_out = run.stdout.decode("utf-8", errors="replace").strip()
        if run.returncode != 0:
            return Outcome(line, "FAIL", f"{program.name} built but exited {run.returncode}:\n{run_out[-4000:]}")
        return Outcome(line, "PASS", f"{program.name} built and ran: {run_out[-300:]!r}{retried}")


def build_key(line: Line, files: list[Program]) -> tuple:
    """What a line builds and runs: its words (path/to/single_include and single_include are the same
    directory) and its programs' code, arguments and run marks."""
    words = tuple("single_include" if w == "path/to/single_include" else
                  "-Isingle_include" if w == "-Ipath/to/single_include" else w
                  for w in shlex.split(line.command))
    return words, tuple((f.name, f.code, tuple(f.args), f.run) for f in files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: the parent of tests/)")
    parser.add_argument("--cxx", default=None,
                        help="compiler command that replaces each line's own (e.g. 'clang++'); default: as written")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="lines built at once")
    parser.add_argument("--list", action="store_true", help="list the lines and programs, build nothing")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--doc", type=Path, action="append", default=None,
                        help="a Markdown file to check instead of README.md and docs/ (repeatable)")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    docs = [d.resolve() for d in args.doc] if args.doc else documents(root)
    programs, lines, errors = scan(root, docs)
    work_items: list[tuple[Line, list[Program]]] = []
    for line in lines:
        sources = [w for w in shlex.split(line.command) if SOURCE_RE.match(w)]
        if not sources:
            errors.append(f"{line.where}: `{line.command}` names no source file; a compile line names the "
                          f"NAME.cpp it builds")
            continue
        names = [Path(s).name for s in sources]
        unmarked = [n for n in names if n not in programs]
        if unmarked:
            errors.append(f"{line.where}: `{line.command}` builds {', '.join(unmarked)}, but no code block in "
                          f"README.md or docs/ is marked " + ", ".join(f"<!-- file: {n} -->" for n in unmarked))
            continue
        work_items.append((line, [programs[n] for n in names]))
    if args.list:
        for line, files in work_items:
            print(f"{line.where}: {line.command}\n    builds " + ", ".join(f"{p.name} ({p.where})" for p in files))
        for error in errors:
            print(f"ERROR {error}")
        return 1 if errors else 0
    print(f"{len(lines)} compile lines, {len(programs)} marked programs in README.md and docs/", flush=True)

    work = Path(tempfile.mkdtemp(prefix="distribute-compile-lines-"))
    checker = Checker(root, shlex.split(args.cxx) if args.cxx else None, work)
    outcomes: list[Outcome] = []
    try:
        # Lines that build the same programs with the same words (path/to/single_include is
        # single_include) are one build: it runs once, and each line reports its outcome.
        first_of: dict[tuple, int] = {}
        for k, (line, files) in enumerate(work_items):
            first_of.setdefault(build_key(line, files), k)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {k: pool.submit(checker.check, line, files, k)
                       for k, (line, files) in enumerate(work_items)
                       if first_of[build_key(line, files)] == k}
            for k, (line, files) in enumerate(work_items):
                first = first_of[build_key(line, files)]
                outcome = futures[first].result()
                if first != k:
                    outcome = Outcome(line, outcome.status, f"the same build as {work_items[first][0].where}: "
                                                            f"{outcome.detail}")
                outcomes.append(outcome)
                print(f"{outcome.status}  {outcome.line.where}: `{outcome.line.command}`\n"
                      f"{textwrap.indent(outcome.detail, '      ')}", flush=True)
    finally:
        failed = errors or any(o.status == "FAIL" for o in outcomes)
        if failed or args.keep:
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    for error in errors:
        print(f"FAIL  {error}")
    passed = sum(o.status == "PASS" for o in outcomes)
    skipped = sum(o.status == "SKIP" for o in outcomes)
    failures = len(errors) + sum(o.status == "FAIL" for o in outcomes)
    print(f"compile lines: {passed} passed, {skipped} skipped, {failures} failed")
    if failures:
        return 1
    return EXIT_SKIPPED if passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
