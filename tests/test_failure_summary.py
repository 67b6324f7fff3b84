#!/usr/bin/env python3
"""Tests of .ci/failure_summary.py (suite 'build'): a real `meson test --print-errorlogs` run of a
project with a passing, a failing and a hanging test, and one that ASan stops; the summary names the
failing and the timed-out tests with the end of their output, and nothing of the one that passed; of
the ASan report it gives what went wrong and where, not the shadow-byte map that ends it."""

from __future__ import annotations

import re
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
    asan = ['-fsanitize=address', '-fno-omit-frame-pointer']
    test('use_after_free', executable('use_after_free', 'use_after_free.c', c_args: asan, link_args: asan),
         env: {'ASAN_OPTIONS': 'detect_leaks=0'})
    """)

# A read of freed memory 20 calls deep: ASan's report has stacks deeper than the summary prints.
USE_AFTER_FREE = textwrap.dedent("""\
    #include <stdio.h>
    #include <stdlib.h>
    static int reader(int *p, int depth) { return depth == 0 ? *p : reader(p, depth - 1) + 1; }
    int main(void) {
      int *p = malloc(64 * sizeof *p);
      p[3] = 7;
      free(p);
      printf("about to read freed memory\\n");
      fflush(stdout);
      return reader(p + 3, 20);
    }
    """)


class FailureSummaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="failure-summary-test-")
        base = Path(cls.tmp.name)
        (base / "meson.build").write_text(PROJECT, encoding="utf-8")
        (base / "use_after_free.c").write_text(USE_AFTER_FREE, encoding="utf-8")
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
        self.assertEqual(len(results), 3, results)
        by_name = {name: [r for r in results if f" {name} " in r] for name in ("fails", "hangs", "use_after_free")}
        self.assertRegex(by_name["fails"][0], r"^-- \d/4 fails\s+FAIL\s+.*exit status 3$")
        self.assertRegex(by_name["hangs"][0], r"^-- \d/4 hangs\s+TIMEOUT\s+")
        self.assertRegex(by_name["use_after_free"][0], r"^-- \d/4 use_after_free\s+FAIL\s+")

    def test_shows_the_end_of_each_failing_log(self) -> None:
        out = self.summary("--lines", "3")
        fails = out.index(next(line for line in out if " fails " in line))
        self.assertEqual(out[fails + 1:fails + 4],
                         ["   | step 60", "   | stderr:", "   | assertion x == 3 failed"])
        self.assertNotIn("   | step 57", out)
        hangs = out.index(next(line for line in out if " hangs " in line))
        self.assertIn("   | waiting for a peer", out[hangs + 1:])

    def test_a_sanitizer_report_without_its_shadow_map(self) -> None:
        out = self.summary("--frames", "5")
        start = out.index(next(line for line in out if " use_after_free " in line))
        end = next((i for i in range(start + 1, len(out)) if out[i].startswith("-- ")), len(out))
        report = out[start + 1:end]
        text = "\n".join(report)
        self.assertRegex(report[0], r"^   \| ==\d+==ERROR: AddressSanitizer: heap-use-after-free on address")
        self.assertRegex(text, r"READ of size 4 at ")
        self.assertRegex(text, r"\n   \|     #0 reader \S*use_after_free.c:3\n")  # no address
        self.assertRegex(text, r"freed by thread T0 here:")
        self.assertRegex(text, r"previously allocated by thread T0 here:")
        self.assertRegex(text, r"SUMMARY: AddressSanitizer: heap-use-after-free ")
        # reader's 21 frames and main's: cut at 5 per stack
        self.assertNotRegex(text, r"\n   \|\s+#5 ")
        self.assertRegex(text, r"\(\d\d deeper frames left out\)")
        self.assertEqual(len(re.findall(r"SUMMARY: AddressSanitizer", text)), 1, text)  # not again in the tail
        self.assertNotIn("Shadow byte legend", text)
        self.assertNotIn("Heap left redzone", text)
        self.assertIn("   | (ASan's shadow-byte map left out)", report)
        self.assertIn("   | about to read freed memory", report)  # the tail, after the report

    def test_nothing_of_a_passing_test(self) -> None:
        self.assertFalse([line for line in self.summary() if "passes" in line or "all is well" in line])

    def test_log_of_the_first_failures_only(self) -> None:
        out = self.summary("--tests", "1")
        results = [i for i, line in enumerate(out) if line.startswith("-- ")]
        self.assertEqual(len(results), 3, out)
        logs = [out[i + 1:j] for i, j in zip(results, results[1:] + [len(out)])]
        self.assertTrue(logs[0], out)  # the first failure's log, in the order meson printed them
        self.assertEqual(logs[1:], [[], []], out)

    def test_a_clean_log_gives_nothing(self) -> None:
        clean = Path(self.tmp.name) / "clean.log"
        clean.write_text(" 1/1 passes OK 0.01s\n\nOk:                 1\nFail:               0\n",
                         encoding="utf-8")
        proc = subprocess.run([sys.executable, str(SCRIPT), str(clean)], capture_output=True, text=True,
                              timeout=60, check=True)
        self.assertEqual(proc.stdout, "")


if __name__ == "__main__":
    unittest.main()
