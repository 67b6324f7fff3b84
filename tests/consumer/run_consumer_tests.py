#!/usr/bin/env python3
"""Builds a tiny downstream program against distribute the four ways a user would.

  subproject      a meson project using dependency('distribute') with this repository as
                  subprojects/distribute (a symlink to the repo root)
  single_include  <cxx> -std=c++20 -I single_include main.cpp -lfmt -pthread
  install         `meson install` of the repository into a temporary prefix (checking the
                  installed file list), then compile main.cpp with
                  `pkg-config --cflags --libs distribute`
  cmake           the same `meson install`, the prefix moved elsewhere (the CMake package is
                  relocatable), then tests/consumer/cmake_project configured with
                  `cmake -DCMAKE_PREFIX_PATH=<prefix>` (find_package(distribute) and
                  distribute::distribute) and built with `cmake --build`; skipped without cmake

Each check runs the program and expects exit status 0 and "distribute <version>" on stdout,
with <version> read from include/distribute/version.hpp. Everything happens in a fresh
temporary directory (kept on failure, or with --keep); no network is needed.

Exit status: 0 when every check passed (skipped ones aside), 1 when one failed, 77 (meson's
"skipped") when every check was skipped.

Usage: run_consumer_tests.py --root REPO --cxx 'g++' [subproject|single_include|install|cmake|all]...
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
CHECKS = ("subproject", "single_include", "install", "cmake")
VERSION_RE = re.compile(r'^\s*#\s*define\s+DISTRIBUTE_VERSION_STRING\s+"([^"]*)"', re.M)


class CheckFailed(Exception):
    pass


class CheckSkipped(Exception):
    pass


EXIT_SKIPPED = 77  # meson's exit status for a skipped test

# What `meson install` may put outside include/ (paths relative to the prefix; the project is
# configured with the default datadir, share). Every one of these must be installed ...
EXPECTED_EXTRA_FILES = frozenset({
    "share/pkgconfig/distribute.pc",
    "share/cmake/distribute/distributeConfig.cmake",
    "share/cmake/distribute/distributeConfigVersion.cmake",
})
# ... and besides them only programs under these directories (tools/: distribute-launch).
ALLOWED_EXTRA_DIRS = ("bin",)


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

    def meson_install(self, what: str, base: Path) -> Path:
        """`meson install` of the repository into base/prefix; returns the prefix."""
        build, prefix = base / "build", base / "prefix"
        self.sh([*self.meson, "setup", str(build), str(self.root), f"--prefix={prefix}",
                 "-Dtests=false", "-Dexamples=false", "-Dbench=false"],
                f"{what}: meson setup", env=self.meson_env())
        self.sh([*self.meson, "install", "-C", str(build), "--quiet"], f"{what}: meson install")
        return prefix

    def check_installed_files(self, what: str, prefix: Path) -> None:
        """Under include/: exactly the headers of include/. Elsewhere: the pkg-config file and
        the CMake package files (EXPECTED_EXTRA_FILES), and programs in ALLOWED_EXTRA_DIRS."""
        src = {p.relative_to(self.root / "include") for p in (self.root / "include").rglob("*")
               if p.is_file()}
        dst = {p.relative_to(prefix / "include") for p in (prefix / "include").rglob("*")
               if p.is_file() or p.is_symlink()}
        if src != dst:
            raise CheckFailed(f"{what}: installed headers differ from include/: "
                              f"missing {sorted(map(str, src - dst))}, "
                              f"extra {sorted(map(str, dst - src))}")
        print(f"  installed {len(dst)} headers under {prefix / 'include'}")

        others = {p.relative_to(prefix).as_posix() for p in prefix.rglob("*")
                  if (p.is_file() or p.is_symlink())
                  and not p.relative_to(prefix).as_posix().startswith("include/")}
        missing = EXPECTED_EXTRA_FILES - others
        programs = {f for f in others - EXPECTED_EXTRA_FILES
                    if f.split("/", 1)[0] in ALLOWED_EXTRA_DIRS}
        extra = others - EXPECTED_EXTRA_FILES - programs
        if missing or extra:
            raise CheckFailed(f"{what}: unexpected files outside include/ under {prefix}: "
                              f"missing {sorted(missing)}, extra {sorted(extra)} "
                              f"(the list is EXPECTED_EXTRA_FILES in {Path(__file__).name})")
        for f in sorted(EXPECTED_EXTRA_FILES) + sorted(programs):
            print(f"  installed {f}")

    def check_install(self) -> None:
        what = "installed-headers consumer"
        base = self.work / "install"
        prefix = self.meson_install(what, base)
        self.check_installed_files(what, prefix)

        pcs = sorted(prefix.rglob("distribute.pc"))
        if len(pcs) != 1:
            raise CheckFailed(f"{what}: expected one distribute.pc under {prefix}, found {pcs}")
        pc_dir = pcs[0].parent

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

    def cmake_compiler_args(self) -> list[str]:
        """The --cxx command as CMake cache entries: a leading ccache/sccache becomes the
        compiler launcher, the next word the compiler, the rest CMAKE_CXX_FLAGS."""
        words = list(self.cxx)
        args = []
        if len(words) > 1 and Path(words[0]).name in ("ccache", "sccache"):
            args.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={words.pop(0)}")
        args.append(f"-DCMAKE_CXX_COMPILER={words[0]}")
        if words[1:]:
            args.append(f"-DCMAKE_CXX_FLAGS={shlex.join(words[1:])}")
        return args

    def check_cmake(self) -> None:
        what = "CMake find_package consumer"
        cmake = shutil.which("cmake")
        if cmake is None:
            raise CheckSkipped(f"{what}: cmake is not installed (not on PATH); install cmake "
                               f">= 3.14 to run this check")
        print(f"  {self.sh([cmake, '--version'], f'{what}: cmake --version').splitlines()[0]}")
        base = self.work / "cmake"
        installed = self.meson_install(what, base)
        self.check_installed_files(what, installed)
        # The package config finds the headers relative to itself: prove it by moving the prefix.
        prefix = base / "relocated-prefix"
        installed.rename(prefix)
        print(f"  moved the install prefix {installed} to {prefix}")

        project = HERE / "cmake_project"
        common = [f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF",
                  *self.cmake_compiler_args()]
        # An incompatible version request must fail (the version file is installed and works).
        major = int(self.version.split(".")[0])
        try:
            self.sh([cmake, "-S", str(project), "-B", str(base / "build-wrong-version"), *common,
                     f"-DDISTRIBUTE_FIND_ARGS={major + 1}.0"],
                    f"{what}: cmake configure asking for distribute {major + 1}.0")
        except CheckFailed as e:
            if f'compatible with requested version "{major + 1}.0"' not in str(e):
                raise CheckFailed(f"{what}: find_package(distribute {major + 1}.0) failed for "
                                  f"another reason than the version:\n{e}") from None
            print(f"  find_package(distribute {major + 1}.0) is refused, as it should be")
        else:
            raise CheckFailed(f"{what}: find_package(distribute {major + 1}.0) accepted "
                              f"distribute {self.version}")

        build = base / "build"
        out = self.sh([cmake, "-S", str(project), "-B", str(build), *common,
                       f"-DDISTRIBUTE_FIND_ARGS={self.version};EXACT"],
                      f"{what}: cmake configure")
        # CMakeLists.txt prints "-- distribute_DIR=..." and the like, one line each.
        found = dict(re.findall(r"^-- (distribute[^=\n]*)=(.*)$", out, re.M))
        for key, value in found.items():
            print(f"  {key} = {value}")
        if found.get("distribute_VERSION") != self.version:
            raise CheckFailed(f"{what}: distribute_VERSION is {found.get('distribute_VERSION')!r}, "
                              f"expected {self.version!r}:\n{out}")
        for key, path in (("distribute_DIR", prefix / "share" / "cmake" / "distribute"),
                          ("distribute::distribute INTERFACE_INCLUDE_DIRECTORIES",
                           prefix / "include")):
            got = found.get(key)
            if got is None or Path(got).resolve() != path.resolve():
                raise CheckFailed(f"{what}: {key} is {got!r}, expected {str(path)!r}:\n{out}")
        self.sh([cmake, "--build", str(build)], f"{what}: cmake --build")
        self.run_program(build / "consumer", what)


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
    skipped: list[str] = []
    try:
        runner = Runner(root, shlex.split(args.cxx), shlex.split(args.meson), work)
        for check in checks:
            print(f"== consumer check '{check}' (repo {root}, work dir {work})", flush=True)
            try:
                getattr(runner, f"check_{check}")()
                print(f"PASS  {check}", flush=True)
            except CheckSkipped as e:
                print(f"SKIP  {check}: {e}", flush=True)
                skipped.append(check)
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
    if skipped and len(skipped) == len(checks):
        print(f"consumer checks skipped: {', '.join(skipped)}")
        return EXIT_SKIPPED
    passed = [c for c in checks if c not in skipped]
    print(f"all consumer checks passed: {', '.join(passed)}"
          + (f" (skipped: {', '.join(skipped)})" if skipped else ""))
    return 0

if __name__ == "__main__":
    sys.exit(main())
