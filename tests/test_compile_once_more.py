#!/usr/bin/env python3
"""Tests of tests/support/compile_once_more.py (suite 'build'): with stand-in compilers, a command
that fails with g++'s "constraints not satisfied" (or the static_assert reporting the same slip) is
run once more, one that fails that way twice or fails any other way is not; and the consumer checks (tests/consumer/run_consumer_tests.py) build the
single-header program through it, with a real g++ behind a stand-in that fails its first call."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "support"))
from compile_once_more import run_compile  # noqa: E402

CONSUMER_RUNNER = HERE / "consumer" / "run_consumer_tests.py"


def stand_in(base: Path, failures: int, message: str, then: str = "echo built") -> tuple[Path, Path]:
    """A compiler that fails its first `failures` calls printing `message` (exit 1), then runs `then`
    with its arguments; returns the script and the file its calls are counted in."""
    calls = base / "calls"
    script = base / "stand-in-cxx"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {calls}
        if [ "$(wc -l < {calls})" -le {failures} ]; then
          echo "main.cpp:9:12: error: no matching function for call to 'f'" >&2
          echo "{message}" >&2
          exit 1
        fi
        exec {then} "$@"
        """), encoding="utf-8")
    script.chmod(0o755)
    return script, calls


class RunCompileTest(unittest.TestCase):
    def run_stand_in(self, failures: int, message: str) -> tuple[int, str, bool, int]:
        with tempfile.TemporaryDirectory(prefix="compile-once-more-") as tmp:
            script, calls = stand_in(Path(tmp), failures, message)
            proc, second = run_compile([str(script), "-c", "main.cpp"], timeout=60)
            return proc.returncode, proc.stdout.decode(), second, len(calls.read_text().splitlines())

    def test_success_runs_once(self) -> None:
        self.assertEqual(self.run_stand_in(0, ""), (0, "built -c main.cpp\n", False, 1))

    def test_the_constraint_error_runs_once_more(self) -> None:
        code, out, second, calls = self.run_stand_in(1, "main.cpp:9:12: note: constraints not satisfied")
        self.assertEqual((code, out, second, calls), (0, "built -c main.cpp\n", True, 2))

    def test_the_same_slip_through_a_static_assert_runs_once_more(self) -> None:
        code, out, second, calls = self.run_stand_in(
            1, "x.hpp:9:19: error: static assertion failed: ds::Strategy::reduce: the value's type has no "
               "ds::tensor_traits specialisation (it is not TensorLike; see docs/tensors.md)")
        self.assertEqual((code, out, second, calls), (0, "built -c main.cpp\n", True, 2))

    def test_the_same_error_twice_fails_with_the_second_output(self) -> None:
        code, out, second, calls = self.run_stand_in(2, "main.cpp:9:12: note: constraints not satisfied")
        self.assertEqual((code, second, calls), (1, True, 2))
        self.assertIn("constraints not satisfied", out)

    def test_any_other_failure_is_not_run_again(self) -> None:
        code, out, second, calls = self.run_stand_in(1, "main.cpp:3:1: error: 'x' was not declared in this scope")
        self.assertEqual((code, second, calls), (1, False, 1))
        self.assertIn("'x' was not declared", out)


class ConsumerCheckTest(unittest.TestCase):
    @unittest.skipUnless(shutil.which("g++"), "no g++")
    def test_single_include_consumer_builds_after_one_constraint_error(self) -> None:
        with tempfile.TemporaryDirectory(prefix="consumer-once-more-") as tmp:
            script, calls = stand_in(Path(tmp), 1, "main.cpp:9:12: note: constraints not satisfied",
                                     then=shutil.which("g++"))
            proc = subprocess.run([sys.executable, str(CONSUMER_RUNNER), "--cxx", str(script), "single_include"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600,
                                  env=dict(os.environ))
            out = proc.stdout.decode()
            self.assertEqual(proc.returncode, 0, out)
            self.assertIn("(the first run failed with g++'s spurious concept failure; ran it once more)", out)
            self.assertIn("PASS  single_include", out)
            self.assertEqual(len(calls.read_text().splitlines()), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
