#!/usr/bin/env python3
"""Builds a tiny downstream program against distribute the three ways a user would.

  subproject      a meson project using dependency('distribute') with this repository as
                  subprojects/distribute (a symlink to the repo root)
  single_include  <cxx> -std=c++20 -I single_include main.cpp -lfmt -pthread
  install         `meson install` of the repository into a temporary prefix, then
                  compile main.cpp with `pkg-config --cflags --libs distribute`

Each check runs the program and expects exit status 0 and "distribute <version>" on stdout,
with <version> read from include/distribute/version.hpp. Everything happens in a fresh
temporary directory (kept on failure, or with --keep); no network is needed.

Usage: run_consumer_tests.py --root REPO --cxx 'g++' [subproject|single_include|install|all]...
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKS = ("subproject", "single_include", "install")
VERSION_RE = re.compile(r'^\s*#\s*define\s+DISTRIBUTE_VERSION_STRING\s+"([^"]*)"', re.M)


class CheckFailed(Exception):
    pass


class Runner:
    def __init__(self, root: Path, cxx: list[str], meson: list[str], work: Path) -> None:
        self.root = root
        self.cxx = cxx
        self.meson = meson
        self.work = work
        version_hpp = root / "include" / "distribute" / "version.hpp"
        m = VERSION_RE.search(version_hpp.read_text(encoding="utf-8"))
        if not m:
            raise CheckFailed(f"no DISTRIBUTE_VERSION_STRING in {version_hpp}")
        self.version = m.group(1)
        self.main_cpp = HERE / "meson_subproject" / "main.cpp"

    def sh(self, cmd: list[str], what: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> str:
        print(f"$ {shlex.join(cmd)}", flush=True)
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=full_env, cwd=cwd)
        except FileNotFoundError as e:
            raise CheckFailed(f"{what}: cannot run {cmd[0]!r}: {e}") from None
        out = proc.stdout.decode("utf-8", errors="replace")
        if proc.returncode != 0:
            raise CheckFailed(f"{what} failed (exit {proc.returncode}):\n{out.rstrip()}")
        return out

    def run_program(self, exe: Path, what: str) -> None:
        out = self.sh([str(exe)], f"{what}: running the program")
        expected = f"distribute {self.version}"
        if expected not in out:
            raise CheckFailed(f"{what}: program printed {out.strip()!r}, expected {expected!r}")
        print(f"  program printed: {out.strip()}")

    def meson_env(self) -> dict[str, str]:
        return {"CXX": shlex.join(self.cxx)}

    # -- the checks ---------------------------------------------------------------------

    def check_subproject(self) -> None:
        what = "meson subproject consumer"
        proj = self.work / "subproject" / "consumer"
        shutil.copytree(HERE / "meson_subproject", proj)
        (proj / "subprojects").mkdir()
        (proj / "subprojects" / "distribute").symlink_to(self.root, target_is_directory=True)
        print(f"  copied tests/consumer/meson_subproject to {proj}; "
              f"subprojects/distribute -> {self.root}")
        build = self.work / "subproject" / "build"
        out = self.sh([*self.meson, "setup", str(build), str(proj),
                       "--force-fallback-for=distribute"], f"{what}: meson setup",
                      env=self.meson_env())
        if "Executing subproject distribute" not in out:
            raise CheckFailed(f"{what}: meson setup did not use the subproject:\n{out}")
        self.sh([*self.meson, "compile", "-C", str(build)], f"{what}: meson compile")
        self.run_program(build / "consumer", what)

    def check_single_include(self) -> None:
        what = "single-header consumer"
        single = self.root / "single_include" / "distribute" / "distribute.hpp"
        if not single.is_file():
            raise CheckFailed(f"{what}: {single} does not exist; run python3 tools/amalgamate.py")
        exe = self.work / "single_include" / "consumer"
        exe.parent.mkdir(parents=True)
        self.sh([*self.cxx, "-std=c++20", "-Wall", "-Wextra", "-I", str(self.root / "single_include"),
                 str(self.main_cpp), "-o", str(exe), "-lfmt", "-pthread"],
                f"{what}: compile")
        self.run_program(exe, what)

    def check_install(self) -> None:
        what = "installed-headers consumer"
        base = self.work / "install"
        build, prefix = base / "build", base / "prefix"
        self.sh([*self.meson, "setup", str(build), str(self.root), f"--prefix={prefix}",
                 "-Dtests=false", "-Dexamples=false", "-Dbench=false"],
                f"{what}: meson setup", env=self.meson_env())
        self.sh([*self.meson, "install", "-C", str(build), "--quiet"], f"{what}: meson install")

        pcs = sorted(prefix.rglob("distribute.pc"))
        if len(pcs) != 1:
            raise CheckFailed(f"{what}: expected one distribute.pc under {prefix}, found {pcs}")
        pc_dir = pcs[0].parent
        print(f"  installed {pcs[0].relative_to(prefix)}")

        # Every header of include/ is installed, and nothing else under include/distribute.
        src = {p.relative_to(self.root / "include") for p in (self.root / "include").rglob("*")
               if p.is_file()}
        dst = {p.relative_to(prefix / "include") for p in (prefix / "include").rglob("*")
               if p.is_file()}
        if src != dst:
            raise CheckFailed(f"{what}: installed headers differ from include/: "
                              f"missing {sorted(map(str, src - dst))}, "
                              f"extra {sorted(map(str, dst - src))}")
        print(f"  installed {len(dst)} headers under {prefix / 'include'}")

        env = {"PKG_CONFIG_PATH": str(pc_dir)}
        version = self.sh(["pkg-config", "--modversion", "distribute"],
                          f"{what}: pkg-config --modversion", env=env).strip()
        if version != self.version:
            raise CheckFailed(f"{what}: pkg-config says version {version!r}, "
                              f"version.hpp says {self.version!r}")
        flags = self.sh(["pkg-config", "--cflags", "--libs", "distribute"],
                        f"{what}: pkg-config --cflags --libs", env=env).split()
        print(f"  pkg-config --cflags --libs distribute: {' '.join(flags)}")
        if f"-I{prefix / 'include'}" not in flags and str(prefix / "include") != "/usr/include":
            raise CheckFailed(f"{what}: pkg-config cflags lack -I{prefix / 'include'}")
        exe = base / "consumer"
        self.sh([*self.cxx, "-std=c++20", "-Wall", "-Wextra", str(self.main_cpp), "-o", str(exe),
                 *flags], f"{what}: compile")
        self.run_program(exe, what)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent,
                        help="repository root (default: two levels above this script)")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"),
                        help="C++ compiler command, shell-split (default: $CXX or c++)")
    parser.add_argument("--meson", default="meson", help="meson command (default: meson)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("checks", nargs="*", choices=[*CHECKS, "all"], default=["all"])
    args = parser.parse_args(argv)

    checks = list(CHECKS) if "all" in args.checks else list(dict.fromkeys(args.checks))
    root = args.root.resolve()
    work = Path(tempfile.mkdtemp(prefix="distribute-consumer-"))
    failed: list[str] = []
    try:
        runner = Runner(root, shlex.split(args.cxx), shlex.split(args.meson), work)
        for check in checks:
            print(f"== consumer check '{check}' (repo {root}, work dir {work})", flush=True)
            try:
                getattr(runner, f"check_{check}")()
                print(f"PASS  {check}", flush=True)
            except CheckFailed as e:
                print(f"FAIL  {check}: {e}", flush=True)
                failed.append(check)
    except CheckFailed as e:
        print(f"FAIL: {e}")
        failed.append("setup")
    finally:
        if failed or args.keep:
            print(f"(kept {work} for inspection)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"consumer checks failed: {', '.join(failed)}")
        return 1
    print(f"all consumer checks passed: {', '.join(checks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
