#!/usr/bin/env python3
"""Tests of scripts/compile.sh (suite 'build'): with a stand-in `ninja` first on PATH, a build that
fails with g++'s "constraints not satisfied" (or the static_assert that reports the same slip) is run once more, and says so; one that fails that way
twice, or fails any other way, fails with ninja's exit status after at most those two runs."""

from __future__ import annotations

import os
import subprocess
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compile.sh"


class CompileScriptTest(unittest.TestCase):
    def run_with_ninja(self, failures: int, message: str) -> tuple[int, str, list[str]]:
        """compile.sh under a stand-in ninja that fails its first `failures` runs printing `message`
        (exit 2), then succeeds; returns compile.sh's status, its output and the stand-in's calls."""
        with tempfile.TemporaryDirectory(prefix="compile-sh-test-") as tmp:
            base = Path(tmp)
            calls = base / "calls"
            ninja = base / "ninja"
            ninja.write_text(textwrap.dedent(f"""\
                #!/bin/sh
                echo "$*" >> {calls}
                n=$(wc -l < {calls})
                if [ "$n" -le {failures} ]; then
                  echo "[1/2] Compiling C++ object x.o"
                  echo "{message}"
                  exit 2
                fi
                echo "[2/2] Linking target x"
                """), encoding="utf-8")
            ninja.chmod(0o755)
            env = dict(os.environ, PATH=f"{base}{os.pathsep}{os.environ['PATH']}")
            proc = subprocess.run(["bash", str(SCRIPT), "builddir", "tests/a", "tests/b"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            return proc.returncode, proc.stdout.decode(), calls.read_text().splitlines()

    def test_a_build_that_succeeds_runs_once(self) -> None:
        code, out, calls = self.run_with_ninja(0, "")
        self.assertEqual(code, 0, out)
        self.assertEqual(calls, ["-C builddir tests/a tests/b"])
        self.assertNotIn("once more", out)

    def test_a_spurious_constraint_error_is_built_again_once(self) -> None:
        code, out, calls = self.run_with_ninja(1, "x.cpp:3:9: note: constraints not satisfied")
        self.assertEqual(code, 0, out)
        self.assertEqual(calls, ["-C builddir tests/a tests/b"] * 2)
        self.assertIn("== compile.sh: the build failed with g++'s spurious concept failure; running it once more", out)

    def test_the_same_slip_through_a_static_assert_is_built_again_once(self) -> None:
        code, out, calls = self.run_with_ninja(
            1, "x.hpp:9:19: error: static assertion failed: ds::Strategy::reduce: the value's type has no "
               "ds::tensor_traits specialisation (it is not TensorLike; see docs/tensors.md)")
        self.assertEqual(code, 0, out)
        self.assertEqual(calls, ["-C builddir tests/a tests/b"] * 2)

    def test_the_same_error_twice_fails(self) -> None:
        code, out, calls = self.run_with_ninja(2, "x.cpp:3:9: note: constraints not satisfied")
        self.assertEqual(code, 2, out)
        self.assertEqual(len(calls), 2)

    def test_any_other_failure_is_not_run_again(self) -> None:
        code, out, calls = self.run_with_ninja(1, "x.cpp:3:9: error: 'undefined_name' was not declared")
        self.assertEqual(code, 2, out)
        self.assertEqual(len(calls), 1)
        self.assertIn("'undefined_name' was not declared", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
