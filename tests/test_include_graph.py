#!/usr/bin/env python3
"""Tests of tools/include_graph.py (suite 'headers'): on include trees of its own, each rule of the layers
is reported (an upward arrow, a cycle, an include of another folder's detail/, a detail namespace that is
not its folder's, a name qualified with another folder's detail namespace) and a tree that keeps them
passes; then the library's own tree is checked, as CI does."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "include_graph.py"


def header(body: str = "", includes: tuple[str, ...] = ()) -> str:
    lines = ["#pragma once", *(f"#include <distribute/{i}>" for i in includes), "DISTRIBUTE_BEGIN_NAMESPACE",
             textwrap.dedent(body).strip(), "DISTRIBUTE_END_NAMESPACE", ""]
    return "\n".join(lines)


# A tree that keeps every rule: core's shared header outside detail/, its internals in core::detail,
# a higher folder that names only the shared part.
CLEAN = {
    "core/tensor.hpp": header("""
        namespace core::detail {
        inline int twice(int x) { return 2 * x; }
        }  // namespace core::detail
        namespace core {
        inline int shared(int x) { return detail::twice(x); }
        }  // namespace core
        """),
    "collective/packing.hpp": header("""
        namespace collective::detail {
        inline int pack(int x) { return core::shared(x); }
        }  // namespace collective::detail
        """, ("core/tensor.hpp",)),
    "strategy/mirrored.hpp": header("", ("collective/packing.hpp", "core/tensor.hpp")),
}


class IncludeGraphTest(unittest.TestCase):
    def check(self, files: dict[str, str]) -> tuple[int, str]:
        with tempfile.TemporaryDirectory(prefix="include-graph-test-") as tmp:
            for name, text in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            proc = subprocess.run([sys.executable, str(TOOL), "--check", "--root", tmp], capture_output=True,
                                  text=True, timeout=60)
            return proc.returncode, proc.stdout + proc.stderr

    def test_a_tree_that_keeps_the_rules_passes(self) -> None:
        code, out = self.check(CLEAN)
        self.assertEqual(code, 0, out)
        self.assertIn("no upward arrow, no cycle", out)
        self.assertRegex(out, r"collective -> core\s+1")

    def test_an_upward_arrow_and_the_cycle_it_makes(self) -> None:
        tree = dict(CLEAN)
        tree["core/tensor.hpp"] = tree["core/tensor.hpp"].replace(
            "#pragma once", "#pragma once\n#include <distribute/collective/packing.hpp>")
        code, out = self.check(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("upward arrow core -> collective (1 includes: core/tensor.hpp)", out)
        self.assertIn("cycle between folders: core <-> collective", out)

    def test_an_include_of_another_folders_detail(self) -> None:
        tree = dict(CLEAN, **{"core/detail/bits.hpp": header()})
        tree["collective/packing.hpp"] = tree["collective/packing.hpp"].replace(
            "#pragma once", "#pragma once\n#include <distribute/core/detail/bits.hpp>")
        code, out = self.check(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("collective/packing.hpp includes another folder's internals: core/detail/bits.hpp", out)

    def test_a_detail_namespace_that_is_not_its_folders(self) -> None:
        tree = dict(CLEAN)
        tree["collective/packing.hpp"] = tree["collective/packing.hpp"].replace(
            "namespace collective::detail {", "namespace detail {").replace(
            "}  // namespace collective::detail", "}  // namespace detail")
        code, out = self.check(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("collective/packing.hpp:4: namespace detail in folder collective/ (its internals are "
                      "collective::detail)", out)

    def test_a_nested_detail_namespace_is_named_by_its_whole_path(self) -> None:
        tree = dict(CLEAN)
        tree["collective/packing.hpp"] = header("""
            namespace collective {
            namespace detail {
            inline int pack(int x) { return x; }
            }  // namespace detail
            }  // namespace collective
            namespace dlpack {
            namespace detail {
            inline int other(int x) { return x; }
            }  // namespace detail
            }  // namespace dlpack
            """, ("core/tensor.hpp",))
        code, out = self.check(tree)
        self.assertEqual(code, 1, out)
        self.assertNotIn("namespace collective::detail in folder", out)
        self.assertIn("namespace dlpack::detail in folder collective/", out)

    def test_a_name_from_another_folders_detail_namespace(self) -> None:
        tree = dict(CLEAN)
        tree["collective/packing.hpp"] = tree["collective/packing.hpp"].replace(
            "core::shared(x)", "core::detail::twice(x)")
        code, out = self.check(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("collective/packing.hpp:5: names another folder's internals: core::detail::", out)

    def test_a_third_party_namespace_outside_the_library_is_not_judged(self) -> None:
        tree = dict(CLEAN)
        tree["collective/packing.hpp"] += "namespace cereal::traits::detail {\n}  // namespace cereal::traits::detail\n"
        code, out = self.check(tree)
        self.assertEqual(code, 0, out)

    def test_the_library_keeps_its_layers(self) -> None:
        proc = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()
