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
  cmake_subdirectory, cmake_fetchcontent, cmake_install
                  the README's CMake snippets as they stand (the ```cmake/```sh blocks marked
                  <!-- cmake-consumer: NAME -->): its project block with, in place of the line
                  "# ... distribute, one of the three ways below ...", the add_subdirectory block
                  (the source in third_party/distribute), the FetchContent block (from a local
                  git clone, file:///path/to/distribute replaced by its URL) or the find_package
                  block after the README's `cmake --install` commands (path/to/distribute and
                  /opt/distribute replaced). Each builds app.cpp (meson_subproject/main.cpp, on
                  distribute::distribute) and runs it; cmake_subdirectory and cmake_install also
                  build app_compiled (app.cpp on distribute::compiled: the library compiled apart)
                  and train.cpp (cluster_program/train.cpp, on distribute::cluster) and run them,
                  train as two workers (with the installed distribute-launch after cmake
                  --install). FetchContent adds the fetched tree with add_subdirectory: its targets
                  are cmake_subdirectory's, built there. The source is a copy of the working
                  tree's files (`git ls-files`), so uncommitted changes are what is tested.
                  cmake_subdirectory also builds app.cpp with -DDISTRIBUTE_SINGLE_INCLUDE=ON.
                  Skipped without cmake, git, Boost.JSON or OpenSSL
  cmake_cuda      tests/consumer/cuda_project (find_package(distribute OPTIONAL_COMPONENTS cuda)
                  after that `cmake --install`): a host-compiled MirroredStrategy<ds::cuda> program
                  on distribute::cuda, run (on a machine without a GPU it reports Unavailable, which
                  still proves the compile and link); skipped without the CUDA toolkit

Each check runs the program and expects exit status 0 and "distribute <version>" on stdout,
with <version> read from include/distribute/version.hpp. Everything happens in a fresh
temporary directory (kept on failure, or with --keep); no network is needed.

Exit status: 0 when every check passed (skipped ones aside), 1 when one failed, 77 (meson's
"skipped") when every check was skipped.

Usage: run_consumer_tests.py --root REPO --cxx 'g++' [CHECK|all]...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))
from compile_once_more import run_compile  # noqa: E402

CHECKS = ("subproject", "single_include", "install", "cmake", "cmake_subdirectory", "cmake_fetchcontent",
          "cmake_install", "cmake_cuda")
# The README's CMake snippets: <!-- cmake-consumer: NAME --> then a fenced block (indented in a list).
SNIPPET_RE = re.compile(r"<!--\s*cmake-consumer:\s*([\w-]+)\s*-->[ \t]*\n[ \t]*```(\w*)[ \t]*\n(.*?)\n[ \t]*```",
                        re.S)
WAY_PLACEHOLDER = "# ... distribute, one of the three ways below ..."
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
    "share/distribute/src/distribute.cpp",
    "share/cmake/distribute/distributeConfig.cmake",
    "share/cmake/distribute/distributeConfigVersion.cmake",
    "share/cmake/distribute/distributeParts.cmake",
})
# `cmake --install` of the root CMakeLists.txt: the same CMake package, no pkg-config file.
EXPECTED_CMAKE_INSTALL_FILES = frozenset({
    "share/distribute/src/distribute.cpp",
    "share/cmake/distribute/distributeConfig.cmake",
    "share/cmake/distribute/distributeConfigVersion.cmake",
    "share/cmake/distribute/distributeParts.cmake",
    "bin/distribute-launch",
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
           cwd: Path | None = None, compiles: bool = False) -> str:
        """Runs cmd; its output, or CheckFailed with it. A command that `compiles` is run once more
        after g++'s spurious "constraints not satisfied" (tests/support/compile_once_more.py)."""
        print(f"$ {shlex.join(cmd)}", flush=True)
        # In this check's own directory by default: meson's CMake probe writes __cmake_systeminformation/
        # in the working directory, which the checks that meson test runs side by side would share.
        cwd = cwd or self.work
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            if compiles:
                proc, second = run_compile(cmd, env=full_env, cwd=cwd)
                if second:
                    print(f"  (the first run failed with g++'s spurious concept failure; ran it once more)",
                          flush=True)
            else:
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
        self.sh([*self.meson, "compile", "-C", str(build)], f"{what}: meson compile", compiles=True)
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
                f"{what}: compile", compiles=True)
        self.run_program(exe, what)

    def meson_install(self, what: str, base: Path) -> Path:
        """`meson install` of the repository into base/prefix; returns the prefix."""
        build, prefix = base / "build", base / "prefix"
        self.sh([*self.meson, "setup", str(build), str(self.root), f"--prefix={prefix}",
                 "-Dtests=false", "-Dexamples=false", "-Dbench=false"],
                f"{what}: meson setup", env=self.meson_env())
        self.sh([*self.meson, "install", "-C", str(build), "--quiet"], f"{what}: meson install", compiles=True)
        return prefix

    def check_installed_files(self, what: str, prefix: Path,
                              expected_extra: frozenset[str] = EXPECTED_EXTRA_FILES) -> None:
        """Under include/: exactly the headers of include/. Elsewhere: the pkg-config file and
        the CMake package files (expected_extra), and programs in ALLOWED_EXTRA_DIRS."""
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
        missing = expected_extra - others
        programs = {f for f in others - expected_extra
                    if f.split("/", 1)[0] in ALLOWED_EXTRA_DIRS}
        extra = others - expected_extra - programs
        if missing or extra:
            raise CheckFailed(f"{what}: unexpected files outside include/ under {prefix}: "
                              f"missing {sorted(missing)}, extra {sorted(extra)} "
                              f"(the lists are EXPECTED_*_FILES in {Path(__file__).name})")
        for f in sorted(expected_extra) + sorted(programs):
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
                 *flags], f"{what}: compile", compiles=True)
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

    # -- the README's CMake snippets -------------------------------------------------------

    def readme_snippets(self) -> dict[str, str]:
        readme = self.root / "README.md"
        found = {m.group(1): textwrap.dedent(m.group(3))
                 for m in SNIPPET_RE.finditer(readme.read_text(encoding="utf-8"))}
        for name in ("project", "add_subdirectory", "fetchcontent", "install", "find_package"):
            if name not in found:
                raise CheckFailed(f"README.md has no block marked <!-- cmake-consumer: {name} -->")
        if WAY_PLACEHOLDER not in found["project"]:
            raise CheckFailed(f"README.md's project block lacks the line {WAY_PLACEHOLDER!r}")
        return found

    def require_cmake_tools(self, what: str) -> str:
        cmake = shutil.which("cmake")
        if cmake is None:
            raise CheckSkipped(f"{what}: cmake is not installed (not on PATH)")
        if shutil.which("git") is None:
            raise CheckSkipped(f"{what}: git is not installed (the source copy is made with git ls-files)")
        # distribute::cluster (train.cpp) needs Boost.JSON and OpenSSL's headers.
        for header in ("boost/json.hpp", "openssl/hmac.h"):
            probe = subprocess.run([*self.cxx, "-std=c++20", "-x", "c++", "-E", "-", "-o", os.devnull],
                                   input=f"#include <{header}>\n".encode(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            if probe.returncode != 0:
                raise CheckSkipped(f"{what}: <{header}> is not found: no distribute::cluster to link train.cpp")
        return cmake

    def source_snapshot(self) -> Path:
        """A copy of the working tree's files (tracked and untracked, not ignored), made a git
        repository with one commit on branch main: what a user clones or vendors."""
        snap = self.work / "snapshot" / "distribute"
        if snap.exists():
            return snap
        files = self.sh(["git", "-C", str(self.root), "ls-files", "-z", "--cached", "--others",
                         "--exclude-standard"], "listing the repository's files with git ls-files")
        count = 0
        for rel in files.split("\0"):
            src = self.root / rel
            if not rel or not src.is_file():
                continue  # deleted in the working tree
            dst = snap / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            count += 1
        git = ["git", "-C", str(snap), "-c", "user.name=consumer test", "-c", "user.email=consumer@test",
               "-c", "init.defaultBranch=main"]
        self.sh([*git, "init", "-q"], "git init of the source copy")
        self.sh([*git, "checkout", "-q", "-b", "main"], "git checkout -b main")
        self.sh([*git, "add", "-A"], "git add of the source copy")
        self.sh([*git, "commit", "-q", "-m", "snapshot of the working tree"], "git commit of the source copy")
        print(f"  copied {count} files of the working tree to {snap} (a git repository, branch main)")
        return snap

    def cmake_project(self, what: str, base: Path, way: str, replacements: dict[str, str]) -> Path:
        """Writes the README's project block with the block of `way` in it, and app.cpp/train.cpp."""
        snippets = self.readme_snippets()
        block = snippets[way]
        for old, new in replacements.items():
            if old not in block:
                raise CheckFailed(f"{what}: README.md's '{way}' block no longer contains {old!r}:\n{block}")
            block = block.replace(old, new)
        project = base / "project"
        project.mkdir(parents=True)
        text = snippets["project"].replace(WAY_PLACEHOLDER, block.rstrip("\n"))
        (project / "CMakeLists.txt").write_text(text, encoding="utf-8")
        shutil.copy2(self.main_cpp, project / "app.cpp")
        shutil.copy2(HERE / "cluster_program" / "train.cpp", project / "train.cpp")
        print(f"  {project / 'CMakeLists.txt'} (from README.md):")
        print(textwrap.indent(text.rstrip("\n"), "    | "))
        return project

    def build_and_run_cmake_project(self, what: str, cmake: str, project: Path, build: Path,
                                    extra: list[str], launcher: Path | None, every_target: bool = True) -> None:
        """Configures the project and builds and runs app, app_compiled and train; with every_target
        False, app alone (the targets' definitions are another check's)."""
        self.sh([cmake, "-S", str(project), "-B", str(build), "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF",
                 *self.cmake_compiler_args(), *extra], f"{what}: cmake configure")
        if not every_target:
            self.sh([cmake, "--build", str(build), "--target", "app"], f"{what}: cmake --build --target app",
                    compiles=True)
            self.run_program(build / "app", what)
            return
        self.sh([cmake, "--build", str(build)], f"{what}: cmake --build", compiles=True)
        self.run_program(build / "app", what)
        self.run_program(build / "app_compiled", f"{what} (distribute::compiled)")
        self.run_two_workers(what, build / "train", launcher)

    @staticmethod
    def free_ports(n: int) -> list[int]:
        socks = []
        try:
            for _ in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                socks.append(s)
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()

    def run_two_workers(self, what: str, exe: Path, launcher: Path | None) -> None:
        """train.cpp as a 2-worker job: every worker must report the all-reduce of both (3)."""
        if launcher is not None:
            out = self.sh([str(launcher), "-n", "2", "--token", "auto", "--timeout", "120", str(exe)],
                          f"{what}: {launcher.name} -n 2 {exe.name}")
            outputs = {k: "\n".join(line for line in out.splitlines() if line.startswith(f"[worker:{k}] "))
                       for k in range(2)}
        else:
            ports = self.free_ports(2)
            cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
            procs = []
            for k in range(2):
                env = dict(os.environ, DISTRIBUTE_CLUSTER_TOKEN="consumer-test-token",
                           TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": k}}))
                procs.append(subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              env=env))
            print(f"$ TF_CONFIG=... {exe}  (2 workers: {cluster['worker']})", flush=True)
            outputs = {}
            for k, proc in enumerate(procs):
                try:
                    out, _ = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    for p in procs:
                        p.kill()
                    raise CheckFailed(f"{what}: worker {k} of {exe.name} did not finish in 120 s") from None
                outputs[k] = out.decode("utf-8", errors="replace")
                if proc.returncode != 0:
                    raise CheckFailed(f"{what}: worker {k} of {exe.name} exited {proc.returncode}:\n{outputs[k]}")
        for k in range(2):
            expected = f"distribute {self.version} cluster: worker {k} of 2, all-reduce 3,"
            if expected not in outputs[k]:
                raise CheckFailed(f"{what}: worker {k} printed {outputs[k]!r}, expected {expected!r}")
            print(f"  worker {k} printed: {outputs[k].strip()}")

    def check_cmake_subdirectory(self) -> None:
        what = "CMake add_subdirectory consumer"
        cmake = self.require_cmake_tools(what)
        base = self.work / "cmake_subdirectory"
        project = self.cmake_project(what, base, "add_subdirectory", {})
        (project / "third_party").mkdir()
        shutil.copytree(self.source_snapshot(), project / "third_party" / "distribute", symlinks=True)
        self.build_and_run_cmake_project(what, cmake, project, base / "build", [], None)
        # -DDISTRIBUTE_SINGLE_INCLUDE=ON: the same targets on the one generated header.
        build = base / "build-single-include"
        self.sh([cmake, "-S", str(project), "-B", str(build), "-DDISTRIBUTE_SINGLE_INCLUDE=ON",
                 "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *self.cmake_compiler_args()],
                f"{what}: cmake configure with -DDISTRIBUTE_SINGLE_INCLUDE=ON")
        self.sh([cmake, "--build", str(build), "--target", "app"], f"{what}: cmake --build --target app", compiles=True)
        commands = json.loads((build / "compile_commands.json").read_text(encoding="utf-8"))
        app_command = next(c["command"] for c in commands if c["file"].endswith("app.cpp"))
        single = str(project / "third_party" / "distribute" / "single_include")
        if single not in app_command or str(project / "third_party" / "distribute" / "include ") in app_command:
            raise CheckFailed(f"{what}: with DISTRIBUTE_SINGLE_INCLUDE=ON app.cpp is not compiled against "
                              f"{single} alone: {app_command}")
        print(f"  DISTRIBUTE_SINGLE_INCLUDE=ON: app.cpp compiles with -I{single}")
        self.run_program(build / "app", f"{what} (DISTRIBUTE_SINGLE_INCLUDE=ON)")

    def check_cmake_fetchcontent(self) -> None:
        what = "CMake FetchContent consumer"
        cmake = self.require_cmake_tools(what)
        base = self.work / "cmake_fetchcontent"
        url = self.source_snapshot().as_uri()
        project = self.cmake_project(what, base, "fetchcontent", {"file:///path/to/distribute": url})
        # FetchContent clones the source and adds it with add_subdirectory: the targets are those of the
        # same CMakeLists.txt that cmake_subdirectory builds every one of, so app alone shows the fetch.
        self.build_and_run_cmake_project(what, cmake, project, base / "build", [], None, every_target=False)

    def cmake_install_prefix(self, what: str) -> Path:
        """The README's install commands, run as written but for the paths (once per run)."""
        prefix = self.work / "cmake_install" / "prefix"
        if prefix.exists():
            return prefix
        base = prefix.parent
        base.mkdir(parents=True, exist_ok=True)
        snapshot = self.source_snapshot()
        for line in self.readme_snippets()["install"].splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            words = [w.replace("path/to/distribute", str(snapshot)).replace("/opt/distribute", str(prefix))
                     for w in shlex.split(line)]
            if words[0] != "cmake":
                raise CheckFailed(f"{what}: README.md's install block runs {words[0]!r}, not cmake: {line}")
            if words[1:2] == ["-S"]:
                words += self.cmake_compiler_args()
            self.sh(words, f"{what}: {line}", cwd=base, compiles=True)
        self.check_installed_files(what, prefix, EXPECTED_CMAKE_INSTALL_FILES)
        return prefix

    def check_cmake_install(self) -> None:
        what = "CMake install + find_package consumer"
        cmake = self.require_cmake_tools(what)
        prefix = self.cmake_install_prefix(what)
        base = self.work / "cmake_install"
        project = self.cmake_project(what, base, "find_package", {})
        self.build_and_run_cmake_project(what, cmake, project, base / "build", [f"-DCMAKE_PREFIX_PATH={prefix}"],
                                         prefix / "bin" / "distribute-launch")

    def check_cmake_cuda(self) -> None:
        what = "CMake distribute::cuda consumer"
        cmake = self.require_cmake_tools(what)
        prefix = self.cmake_install_prefix(what)
        build = self.work / "cmake_cuda" / "build"
        out = self.sh([cmake, "-S", str(HERE / "cuda_project"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                       "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", *self.cmake_compiler_args()],
                      f"{what}: cmake configure")
        if "distribute::cuda: not found" in out:
            raise CheckSkipped(f"{what}: no CUDA toolkit found, so no distribute::cuda")
        print(f"  {next(line for line in out.splitlines() if 'distribute::cuda:' in line)}")
        self.sh([cmake, "--build", str(build)], f"{what}: cmake --build", compiles=True)
        out = self.sh([str(build / "cuda_app")], f"{what}: running the program")
        if f"distribute {self.version} cuda: " not in out:
            raise CheckFailed(f"{what}: the program printed {out!r}")
        print(f"  program printed: {out.strip()}")

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

        # An unknown component is refused with a message that names it and the real ones.
        try:
            self.sh([cmake, "-S", str(project), "-B", str(base / "build-bad-component"), *common,
                     "-DDISTRIBUTE_FIND_ARGS=COMPONENTS;nope"],
                    f"{what}: cmake configure asking for component 'nope'")
        except CheckFailed as e:
            if "distribute has no component 'nope' (it has: cluster, cuda, mpi)" not in str(e):
                raise CheckFailed(f"{what}: find_package(distribute COMPONENTS nope) failed without naming "
                                  f"the component:\n{e}") from None
            print("  find_package(distribute COMPONENTS nope) is refused, naming the component")
        else:
            raise CheckFailed(f"{what}: find_package(distribute COMPONENTS nope) succeeded")

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
        self.sh([cmake, "--build", str(build)], f"{what}: cmake --build", compiles=True)
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
