#!/usr/bin/env python3
"""Tests of tests/check_compile_lines.py on Markdown fixtures (suite 'docs').

Each fixture is a small document in a temporary directory with programs that need no library, so
the compiler runs in well under a second per line. Every outcome the checker can give is fed in:
a line that builds and runs, a program that exits non-zero, one that does not compile, arguments
and -o, norun, the three reasons to skip (a missing -I directory, a library that does not link, a
missing third-party header), a missing distribute header (a failure), and the errors in the
convention (no source file, unmarked programs, a name marked twice, an unknown setting), a
program of two files, and a compiler that fails with "constraints not satisfied" once (the line is
compiled again and passes, saying so) or every time (it fails).
The checker's messages are compared with the expected text.

Usage: test_check_compile_lines.py [--cxx g++]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKER = HERE / "check_compile_lines.py"
CXX = "g++"

FIXTURE = textwrap.dedent("""\
    # Fixture

    <!-- file: ok.cpp -->
    ```cpp
    #include <cstdio>
    int main() { std::puts("hello from ok"); }
    ```

    Build it with `CXX -std=c++20 ok.cpp`.

    <!-- file: fails.cpp -->
    ```cpp
    int main() { return 3; }
    ```

    `CXX fails.cpp`

    <!-- file: broken.cpp -->
    ```cpp
    int main() { return undefined_name; }
    ```

    `CXX broken.cpp`

    <!-- file: args.cpp; args: {tmp}/x hello -->
    ```cpp
    #include <string>
    int main(int argc, char** argv) { return argc == 3 && std::string(argv[2]) == "hello" ? 0 : 5; }
    ```

    `CXX args.cpp -o args_prog`

    <!-- file: lib.cpp; norun -->
    ```cpp
    int helper() { return 1; }
    ```

    `CXX -c lib.cpp`

    <!-- file: two_main.cpp -->
    ```cpp
    int helper();
    int main() { return helper() == 1 ? 0 : 4; }
    ```

    A program of two files: `CXX two_main.cpp lib.cpp -o two`.

    <!-- file: third_party.cpp -->
    ```cpp
    #include <no_such_header_xyz.h>
    int main() {}
    ```

    <!-- file: own_header.cpp -->
    ```cpp
    #include <distribute/no_such_part.hpp>
    int main() {}
    ```

    ```sh
    CXX -std=c++20 \\
        ok.cpp -o continued    # a comment
    CXX -I/nonexistent/include/dir ok.cpp
    CXX ok.cpp -lno_such_library_xyz
    CXX third_party.cpp
    CXX own_header.cpp
    ```

    Convention errors: `CXX -std=c++20 -c` and `CXX a.cpp b.cpp` and `CXX unmarked.cpp`.

    <!-- file: settings.cpp; bogus -->
    ```cpp
    int main() {}
    ```
    """)

SECOND = textwrap.dedent("""\
    <!-- file: ok.cpp -->
    ```cpp
    int main() {}
    ```
    """)


def run_checker(*docs: Path, cxx: str | None = None) -> tuple[int, str]:
    cmd = [sys.executable, str(CHECKER), "--root", str(HERE.parent), "--jobs", "2"]
    if cxx:
        cmd += ["--cxx", cxx]
    for d in docs:
        cmd += ["--doc", str(d)]
    # The checker keeps its directory when a line fails: put it in the fixtures' directory.
    env = dict(os.environ, TMPDIR=str(docs[0].parent))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, env=env)
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")


class CompileLinesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="check-compile-lines-test-")
        base = Path(cls.tmp.name)
        cls.fixture = base / "fixture.md"
        cls.fixture.write_text(FIXTURE.replace("CXX", CXX), encoding="utf-8")
        cls.second = base / "second.md"
        cls.second.write_text(SECOND, encoding="utf-8")
        cls.code, cls.out = run_checker(cls.fixture, cls.second)
        print(cls.out)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def expect(self, text: str) -> None:
        self.assertIn(text, self.out)

    def at(self, needle: str, doc: str = "fixture") -> str:
        """FILE:LINE of the fixture line that contains `needle` (1-based, as the checker reports)."""
        path = self.fixture if doc == "fixture" else self.second
        for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if needle in line:
                return f"{path}:{k}"
        raise AssertionError(f"{needle!r} is not in the {doc}")

    def test_exit_status_is_failure(self) -> None:
        self.assertEqual(self.code, 1)
        self.expect("compile lines: 5 passed, 3 skipped, 8 failed")

    def test_passing_lines(self) -> None:
        self.expect(f"PASS  {self.at('Build it with')}: `{CXX} -std=c++20 ok.cpp`\n"
                    f"      ok.cpp built and ran: 'hello from ok'")
        self.expect(f"`{CXX} args.cpp -o args_prog`\n      args.cpp built and ran: ''")
        self.expect(f"`{CXX} -c lib.cpp`\n      lib.cpp built (not run: norun)")
        self.expect(f"PASS  {self.at('A program of two files')}: `{CXX} two_main.cpp lib.cpp -o two`\n"
                    f"      two_main.cpp built and ran: ''")
        # a backslash continues a line of a fenced block; a trailing comment is dropped
        continued = self.at(CXX + " -std=c++20 \\")
        self.expect(f"PASS  {continued}: `{CXX} -std=c++20 ok.cpp -o continued`\n"
                    f"      ok.cpp built and ran: 'hello from ok'")

    def test_failing_programs(self) -> None:
        self.expect(f"`{CXX} fails.cpp`\n      fails.cpp built but exited 3")
        self.expect(f"`{CXX} broken.cpp`\n      broken.cpp does not build with this line:")
        self.expect("undefined_name")
        # distribute's own headers must exist: not a skip
        own = self.at(CXX + " own_header.cpp")
        self.expect(f"FAIL  {own}: `{CXX} own_header.cpp`\n"
                    f"      own_header.cpp does not build with this line:")

    def test_skips(self) -> None:
        self.expect(f"SKIP  {self.at('nonexistent')}: `{CXX} -I/nonexistent/include/dir ok.cpp`\n"
                    f"      /nonexistent/include/dir does not exist")
        self.expect(f"`{CXX} ok.cpp -lno_such_library_xyz`\n      -lno_such_library_xyz does not link here")
        self.expect(f"`{CXX} third_party.cpp`\n      <no_such_header_xyz.h> is not installed here")

    def test_convention_errors(self) -> None:
        self.expect(f"FAIL  {self.at('Convention errors')}: `{CXX} -std=c++20 -c` names no source file; "
                    f"a compile line names the NAME.cpp it builds")
        self.expect(f"`{CXX} a.cpp b.cpp` builds a.cpp, b.cpp, but no code block in README.md or docs/ is marked "
                    f"<!-- file: a.cpp -->, <!-- file: b.cpp -->")
        self.expect(f"`{CXX} unmarked.cpp` builds unmarked.cpp, but no code block in README.md or docs/ is "
                    f"marked <!-- file: unmarked.cpp -->")
        self.expect(f"FAIL  {self.at('```cpp', 'second')}: ok.cpp is marked twice (also at {self.at('```cpp')}); "
                    f"file names must be unique across README.md and docs/")
        path, marker_line = self.at("file: settings.cpp").rsplit(":", 1)
        self.expect(f"FAIL  {path}:{int(marker_line) + 1}: unknown setting 'bogus' in the file marker of settings.cpp")

    def test_all_skipped_is_77_and_all_passed_is_0(self) -> None:
        base = Path(self.tmp.name)
        skipped = base / "skipped.md"
        skipped.write_text(f"<!-- file: s.cpp -->\n```cpp\nint main() {{}}\n```\n\n`{CXX} s.cpp -lno_such_library_xyz`\n",
                           encoding="utf-8")
        code, out = run_checker(skipped)
        self.assertEqual(code, 77, out)
        self.assertIn("compile lines: 0 passed, 1 skipped, 0 failed", out)
        passed = base / "passed.md"
        passed.write_text(f"<!-- file: p.cpp -->\n```cpp\nint main() {{}}\n```\n\n`{CXX} p.cpp`\n", encoding="utf-8")
        code, out = run_checker(passed)
        self.assertEqual(code, 0, out)
        self.assertIn("compile lines: 1 passed, 0 skipped, 0 failed", out)

    def test_spurious_constraint_error_is_compiled_again_once(self) -> None:
        base = Path(self.tmp.name)
        doc = base / "flaky.md"
        doc.write_text(f"<!-- file: f.cpp -->\n```cpp\nint main() {{}}\n```\n\n`{CXX} f.cpp`\n", encoding="utf-8")
        # A compiler that fails with g++'s message the first FAILS times, then compiles.
        def flaky(fails: int) -> str:
            script = base / f"flaky_cxx_{fails}.sh"
            count = base / f"flaky_cxx_{fails}.count"
            script.write_text(textwrap.dedent(f"""\
                #!/bin/sh
                n=$(cat {count} 2>/dev/null || echo 0)
                echo $((n + 1)) > {count}
                if [ "$n" -lt {fails} ]; then
                  echo "f.cpp:1:1: note: constraints not satisfied"
                  exit 1
                fi
                exec {CXX} "$@"
                """), encoding="utf-8")
            script.chmod(0o755)
            return str(script)
        code, out = run_checker(doc, cxx=flaky(1))
        self.assertEqual(code, 0, out)
        self.assertIn("f.cpp built and ran: '' (the first try failed with g++'s spurious concept failure; "
                      "the second built it)", out)
        code, out = run_checker(doc, cxx=flaky(2))
        self.assertEqual(code, 1, out)
        self.assertIn("f.cpp does not build with this line:\n      f.cpp:1:1: note: constraints not satisfied", out)
        self.assertEqual((base / "flaky_cxx_2.count").read_text().strip(), "2")  # tried twice, not more

    def test_lines_of_the_same_build_compile_once(self) -> None:
        base = Path(self.tmp.name)
        doc = base / "same.md"
        doc.write_text(f"<!-- file: same.cpp -->\n```cpp\nint main() {{}}\n```\n\n"
                       f"`{CXX} -I path/to/single_include same.cpp`\n\n"
                       f"`{CXX} -I single_include same.cpp`\n\n"
                       f"`{CXX} -I single_include -DOTHER same.cpp`\n", encoding="utf-8")
        count = base / "counting_cxx.count"
        script = base / "counting_cxx.sh"
        script.write_text(f"#!/bin/sh\necho x >> {count}\nexec {CXX} \"$@\"\n", encoding="utf-8")
        script.chmod(0o755)
        code, out = run_checker(doc, cxx=str(script))
        self.assertEqual(code, 0, out)
        self.assertIn("compile lines: 3 passed, 0 skipped, 0 failed", out)
        first = f"{doc}:6"
        self.assertIn(f"PASS  {doc}:8: `{CXX} -I single_include same.cpp`\n"
                      f"      the same build as {first}: same.cpp built and ran: ''", out)
        # the first two lines are one build; -DOTHER is another
        self.assertEqual(len(count.read_text().split()), 2, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--cxx", default="g++")
    args, rest = parser.parse_known_args()
    CXX = args.cxx
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
