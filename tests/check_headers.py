#!/usr/bin/env python3
"""Compiles every public header under include/distribute on its own (-fsyntax-only), so that
each is self-contained: it includes what it uses. Headers under detail/ are internal and are
compiled through the public ones that include them (checking each alone too would double the
cost of this test on a 2-core CI machine)."""
import argparse
import shlex
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tempfile

# Headers that need an optional toolkit are checked only when it is present, with its flags.
# backends/cuda: the CUDA runtime headers, and Thrust (CCCL) on its sequential CPP device system,
# the host compiler's way to build the device-shaped code (nvcc builds it for CUDA).
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
OPTIONAL = {
    "backends/cuda": (
        [f"{CUDA_HOME}/include/cuda_runtime.h", f"{CUDA_HOME}/include/cccl/thrust/device_vector.h"],
        ["-isystem", f"{CUDA_HOME}/include", "-isystem", f"{CUDA_HOME}/include/cccl",
         "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP"],
    ),
    # The adapters: checked where their library's headers are installed (Debian's paths).
    "adapters/eigen": (["/usr/include/eigen3/Eigen/Core"], ["-isystem", "/usr/include/eigen3"]),
    "adapters/torch": (["/usr/include/ATen/core/Tensor.h"], []),
    "adapters/dlpack": (["/usr/include/dlpack/dlpack.h"], []),
    "adapters/xtensor": (["/usr/include/xtensor/xarray.hpp"], []),
    # The library's own file of a program compiled apart: only with DISTRIBUTE_SEPARATE_COMPILATION.
    "src.hpp": ([], ["-DDISTRIBUTE_SEPARATE_COMPILATION"]),
}


def optional_part(rel: str):
    for prefix, (needs, flags) in OPTIONAL.items():
        if rel.startswith("distribute/" + prefix):
            return needs, flags
    return [], []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default="c++", help="the compiler command, with its wrapper if any (\"ccache g++\")")
    ap.add_argument("--include", required=True)
    args = ap.parse_args()
    root = pathlib.Path(args.include)
    headers = sorted(p for p in (root / "distribute").rglob("*.hpp") if "detail" not in p.parts)
    todo = []
    for h in headers:
        rel = h.relative_to(root).as_posix()
        needs, _ = optional_part(rel)
        if all(os.path.exists(n) for n in needs):
            todo.append(rel)

    def check(rel: str):
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
            f.write(f"#include <{rel}>\n#include <{rel}>\nint main() {{}}\n")
            name = f.name
        try:
            r = subprocess.run([*shlex.split(args.cxx), "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{root}",
                                *optional_part(rel)[1], name],
                               capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
            return rel, r.returncode, r.stderr
        finally:
            os.unlink(name)

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for rel, rc, err in pool.map(check, todo):
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {rel}")
            if rc:
                failed += 1
                print(err[:4000])
    print(f"{len(todo) - failed} of {len(todo)} headers compile on their own")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
