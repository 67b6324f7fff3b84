#!/usr/bin/env python3
"""Compiles every header under include/distribute on its own (-fsyntax-only), so that each
public header is self-contained: it includes what it uses."""
import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tempfile

# Headers that need an optional toolkit are checked only when it is present.
OPTIONAL = {
    "backends/cuda": "/usr/local/cuda/include/cuda_runtime.h",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default="c++")
    ap.add_argument("--include", required=True)
    args = ap.parse_args()
    root = pathlib.Path(args.include)
    headers = sorted(p for p in (root / "distribute").rglob("*.hpp"))
    todo = []
    for h in headers:
        rel = h.relative_to(root).as_posix()
        skip = any(rel.startswith("distribute/" + k) and not os.path.exists(v) for k, v in OPTIONAL.items())
        if not skip:
            todo.append(rel)

    def check(rel: str):
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
            f.write(f"#include <{rel}>\n#include <{rel}>\nint main() {{}}\n")
            name = f.name
        try:
            r = subprocess.run([args.cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{root}", name],
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
