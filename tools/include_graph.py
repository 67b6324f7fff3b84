#!/usr/bin/env python3
"""Prints the folder-level include graph of include/distribute/ and checks it against the layers.

The layers, bottom to top, are those of the design document (core at the bottom, the umbrella header on
top). An include is an arrow from the including folder to the included one; arrows must point down
(or stay inside a folder). Besides the order, a folder's `detail/` belongs to that folder alone: an
include of another folder's `detail/` is reported, and so is, inside the library's namespace, a
`namespace ...detail` other than `<folder>::detail` or a name qualified with another folder's
`<folder>::detail::`. What several folders share is a header of the lower folder outside its
`detail/`, in the namespace `distribute::<folder>`.

Usage:
  python3 tools/include_graph.py            # the graph (arrow, number of includes), then any violation
  python3 tools/include_graph.py --check    # the same; exit 1 on any violation
  python3 tools/include_graph.py --dot      # the graph in Graphviz's dot language
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "include" / "distribute"

# Bottom to top. `version` is version.hpp (the ABI namespace macros every header starts from);
# `umbrella` is distribute.hpp, which includes the public headers of every part.
LAYERS = [
    "version",
    "core",
    "observe",     # metrics and timeline: recorded by net/, strategy/ and ps/
    "backends",
    "collective",
    "net",
    "cluster",
    "data",
    "strategy",
    "ps",
    "checkpoint",
    "summary",
    "adapters",    # tensor_traits for other libraries' tensors: included by the user, not the umbrella
    "umbrella",
]
RANK = {name: i for i, name in enumerate(LAYERS)}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]distribute/([^>"]+)[>"]', re.MULTILINE)
NAMESPACE_OPEN = re.compile(r"^\s*namespace\s+([A-Za-z_][\w:]*)\s*\{")
NAMESPACE_CLOSE = re.compile(r"^\s*\}\s*//\s*namespace\s+([A-Za-z_][\w:]*)")
DETAIL_NAME = re.compile(r"(?<![\w:])(\w+)::detail::\w+")


def folder_of(relative: str) -> str:
    """The layer a path under include/distribute/ belongs to."""
    parts = relative.split("/")
    if len(parts) == 1:
        # src.hpp: the umbrella compiled as the library's own file (DISTRIBUTE_SEPARATE_COMPILATION)
        return {"version.hpp": "version", "distribute.hpp": "umbrella", "src.hpp": "umbrella"}.get(parts[0], parts[0])
    return parts[0]


def is_detail(relative: str) -> bool:
    return "detail" in relative.split("/")[:-1]


def namespace_problems(relative: str, text: str) -> list[str]:
    """A `detail` namespace of another name than `<folder>::detail`, opened inside the library's
    namespace (DISTRIBUTE_BEGIN_NAMESPACE; a specialisation in a third-party namespace is outside
    it), and names qualified with another folder's `<folder>::detail::`."""
    folder = folder_of(relative)
    if folder not in RANK or folder in ("version", "umbrella"):
        return []
    problems, inside, stack = [], False, []
    for number, line in enumerate(text.splitlines(), 1):
        if "DISTRIBUTE_BEGIN_NAMESPACE" in line:
            inside = True
        elif "DISTRIBUTE_END_NAMESPACE" in line:
            inside = False
        if not inside or line.lstrip().startswith("//"):
            continue
        opened = NAMESPACE_OPEN.match(line)
        closed = NAMESPACE_CLOSE.match(line)
        if opened:
            stack.append(opened.group(1))
            name = "::".join(stack)
            if name.split("::")[-1] == "detail" and name != f"{folder}::detail":
                problems.append(f"{relative}:{number}: namespace {name} in folder {folder}/ (its internals are "
                                f"{folder}::detail)")
        elif closed and stack:
            stack.pop()
        code = line.split("//", 1)[0]
        for owner in DETAIL_NAME.findall(code):
            if owner != folder and owner in RANK:
                problems.append(f"{relative}:{number}: names another folder's internals: {owner}::detail::")
    return problems


def scan(root: Path):
    """(arrows: Counter[(from, to)], foreign_details: list[(file, included)])"""
    arrows: collections.Counter = collections.Counter()
    foreign: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".hpp", ".h", ".cuh") or not path.is_file():
            continue
        relative = path.relative_to(root).as_posix()
        source = folder_of(relative)
        for included in INCLUDE.findall(path.read_text(encoding="utf-8")):
            target = folder_of(included)
            if target == source:
                continue
            arrows[(source, target)] += 1
            if is_detail(included):
                foreign.append((relative, included))
    return arrows, foreign


def cycles(arrows) -> list[list[str]]:
    """Strongly connected components with more than one folder (Tarjan)."""
    graph = collections.defaultdict(set)
    for a, b in arrows:
        graph[a].add(b)
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component, key=lambda f: RANK.get(f, -1)))

    for v in sorted({a for a, _ in arrows} | {b for _, b in arrows}):
        if v not in index:
            visit(v)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 on any violation")
    parser.add_argument("--dot", action="store_true", help="print the graph in dot")
    parser.add_argument("--root", type=Path, default=ROOT, help="the include/distribute folder to scan")
    args = parser.parse_args()

    arrows, foreign = scan(args.root)
    unknown = sorted({f for pair in arrows for f in pair if f not in RANK})
    upward = sorted(((a, b), n) for (a, b), n in arrows.items()
                    if a in RANK and b in RANK and RANK[b] > RANK[a])
    loops = cycles(arrows)

    if args.dot:
        print("digraph distribute {\n  rankdir=BT;")
        for (a, b), n in sorted(arrows.items()):
            bad = a in RANK and b in RANK and RANK[b] > RANK[a]
            print(f'  "{a}" -> "{b}" [label={n}{", color=red" if bad else ""}];')
        print("}")
    else:
        print("folder-level include graph (arrow: number of #includes), layers bottom to top:")
        print("  " + " < ".join(LAYERS))
        for (a, b), n in sorted(arrows.items(), key=lambda e: (-RANK.get(e[0][0], 99), -RANK.get(e[0][1], 99))):
            mark = "  UPWARD" if a in RANK and b in RANK and RANK[b] > RANK[a] else ""
            print(f"  {a:>10} -> {b:<10} {n:3d}{mark}")

    problems = []
    for folder in unknown:
        problems.append(f"folder '{folder}' has no layer: add it to LAYERS in tools/include_graph.py")
    for (a, b), n in upward:
        files = sorted({f for f, inc in _includes_between(args.root, a, b)})
        problems.append(f"upward arrow {a} -> {b} ({n} includes: {', '.join(files)})")
    for loop in loops:
        problems.append("cycle between folders: " + " <-> ".join(loop))
    for file, included in foreign:
        problems.append(f"{file} includes another folder's internals: {included}")
    for path in sorted(args.root.rglob("*.hpp")):
        problems += namespace_problems(path.relative_to(args.root).as_posix(), path.read_text(encoding="utf-8"))

    if problems:
        print(f"\n{len(problems)} violation(s):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
    else:
        print("\nno upward arrow, no cycle, no foreign detail/ include or name, every detail namespace its folder's")
    return 1 if (args.check and problems) else 0


def _includes_between(root: Path, source: str, target: str):
    for path in sorted(root.rglob("*.hpp")):
        relative = path.relative_to(root).as_posix()
        if folder_of(relative) != source:
            continue
        for included in INCLUDE.findall(path.read_text(encoding="utf-8")):
            if folder_of(included) == target:
                yield relative, included


if __name__ == "__main__":
    sys.exit(main())
