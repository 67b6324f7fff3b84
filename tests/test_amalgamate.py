#!/usr/bin/env python3
"""Tests of tools/amalgamate.py (suite 'headers') on a small include tree of its own.

The tree: an umbrella whose parts come under #if (as the real one's DISTRIBUTE_WITH_... parts do),
a part that includes two headers which both include a third (`leaf.hpp`), and a second part that
includes `leaf.hpp` again. Checked: `leaf.hpp` is inlined once per part block, not once per header
that includes it (a copy's generated guard is no conditional of its own); the result compiles, with
one definition of everything, for each combination of parts and when included twice with a part
added in between."""

from __future__ import annotations

import importlib.util
import subprocess
import tempfile
import textwrap
import unittest
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "amalgamate.py"
spec = importlib.util.spec_from_file_location("amalgamate", TOOL)
amalgamate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(amalgamate)

HEADERS = {
    "version.hpp": '#pragma once\n#define DISTRIBUTE_VERSION_STRING "9.9.9"\n',
    "distribute.hpp": textwrap.dedent("""\
        #include <distribute/version.hpp>
        #if defined(WITH_A)
        #include <distribute/a.hpp>
        #endif
        #if defined(WITH_B)
        #include <distribute/b.hpp>
        #endif
        """),
    "a.hpp": "#pragma once\n#include <distribute/m1.hpp>\n#include <distribute/m2.hpp>\ninline int a() { return m1() + m2(); }\n",
    "m1.hpp": "#pragma once\n#include <distribute/leaf.hpp>\ninline int m1() { return leaf(); }\n",
    "m2.hpp": "#pragma once\n#include <distribute/leaf.hpp>\ninline int m2() { return leaf() + 1; }\n",
    "b.hpp": "#pragma once\n#include <distribute/leaf.hpp>\ninline int b() { return leaf() + 2; }\n",
    "leaf.hpp": "#pragma once\ninline int leaf() { return 40; }\n",
    "src.hpp": "#pragma once\n#include <distribute/distribute.hpp>\n",
}


class AmalgamateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="amalgamate-test-")
        root = Path(cls.tmp.name)
        for name, text in HEADERS.items():
            path = root / "include" / "distribute" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        cls.single = amalgamate.generate(root)[amalgamate.OUTPUT]
        cls.out = root / "single_include" / "distribute" / "distribute.hpp"
        cls.out.parent.mkdir(parents=True)
        cls.out.write_text(cls.single, encoding="utf-8")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def compile(self, program: str) -> subprocess.CompletedProcess:
        src = Path(self.tmp.name) / "program.cpp"
        src.write_text(program, encoding="utf-8")
        return subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-I", str(self.out.parent.parent), str(src)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, text=True)

    def test_a_header_is_inlined_once_per_part_block(self) -> None:
        self.assertEqual(self.single.count("// ---- begin <distribute/leaf.hpp> ----"), 2, self.single)
        self.assertEqual(self.single.count("// ---- begin <distribute/m1.hpp> ----"), 1)

    def test_every_combination_of_parts_compiles(self) -> None:
        for defines, uses in [("", "0"), ("#define WITH_A\n", "a()"), ("#define WITH_B\n", "b()"),
                              ("#define WITH_A\n#define WITH_B\n", "a() + b()")]:
            with self.subTest(defines=defines):
                r = self.compile(f"{defines}#include <distribute/distribute.hpp>\nint main() {{ return {uses}; }}\n")
                self.assertEqual(r.returncode, 0, r.stdout)

    def test_including_again_adds_a_part(self) -> None:
        r = self.compile("#define WITH_B\n#include <distribute/distribute.hpp>\n"
                         "#define WITH_A\n#include <distribute/distribute.hpp>\nint main() { return a() + b(); }\n")
        self.assertEqual(r.returncode, 0, r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
