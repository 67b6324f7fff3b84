#!/usr/bin/env python3
"""Tests of .ci/failure_summary.py (suite 'build'): a real `meson test --print-errorlogs` run of a
project with a passing, a failing and a hanging test; the summary names the failing and the timed-out
test with the end of their output, and nothing of the one that passed."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "failure_summary.py"

PROJECT = textwrap.dedent("""\
    project('summary_fixture', 'c')
    sh = find_program('sh')
    test('passes', sh, args: ['-c', 'echo all is well'])
    test('fails', sh, args: ['-c', 'for i in $(seq 1 60); do echo step $i; done; echo "assertion x == 3 failed" >&2; exit 3'])
    test('hangs', sh, args: ['-c', 'echo waiting for a peer; sleep 30'], timeout: 2)
    """)


class FailureSummaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="failure-summary-test-")
        base = Path(cls.tmp.name)
        (base / "meson.build").write_text(PROJECT, encoding="utf-8")
        subprocess.run(["meson", "setup", str(base / "b"), str(base)], check=True, capture_output=True,
                       timeout=120)
        test = subprocess.run(["meson", "test", "-C", str(base / "b"), "--print-errorlogs"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        assert test.returncode != 0, "the fixture's meson test run should fail"
        cls.log = base / "section.log"
        cls.log.write_bytes(test.stdout)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def summary(self, *args: str) -> list[str]:
        proc = subprocess.run([sys.executable, str(SCRIPT), *args, str(self.log)], capture_output=True,
                              text=True, timeout=60, check=True)
        return proc.stdout.splitlines()

    def test_names_each_failed_and_timed_out_test_once(self) -> None:
        results = [line for line in self.summary() if line.startswith("-- ")]
        self.assertEqual(len(results), 2, results)
        self.assertRegex(results[0], r"^-- 2/3 fails\s+FAIL\s+.*exit status 3$")
        self.assertRegex(results[1], r"^-- 3/3 hangs\s+TIMEOUT\s+")

    def test_shows_the_end_of_each_failing_log(self) -> None:
        out = self.summary("--lines", "3")
        fails = out.index(next(line for line in out if " fails " in line))
        self.assertEqual(out[fails + 1:fails + 4],
                         ["   | step 60", "   | stderr:", "   | assertion x == 3 failed"])
        self.assertNotIn("   | step 57", out)
        hangs = out.index(next(line for line in out if " hangs " in line))
        self.assertIn("   | waiting for a peer", out[hangs + 1:])

    def test_nothing_of_a_passing_test(self) -> None:
        self.assertFalse([line for line in self.summary() if "passes" in line or "all is well" in line])

    def test_log_of_the_first_failures_only(self) -> None:
        out = self.summary("--tests", "1")
        self.assertIn("   | assertion x == 3 failed", out)
        self.assertNotIn("   | waiting for a peer", out)
        self.assertTrue(any(" hangs " in line for line in out))

    def test_a_clean_log_gives_nothing(self) -> None:
        clean = Path(self.tmp.name) / "clean.log"
        clean.write_text(" 1/1 passes OK 0.01s\n\nOk:                 1\nFail:               0\n",
                         encoding="utf-8")
        proc = subprocess.run([sys.executable, str(SCRIPT), str(clean)], capture_output=True, text=True,
                              timeout=60, check=True)
        self.assertEqual(proc.stdout, "")


if __name__ == "__main__":
    unittest.main()
