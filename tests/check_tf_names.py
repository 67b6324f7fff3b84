#!/usr/bin/env python3
"""Every TensorFlow name the seed documents mention (tf.distribute.*, tf.data.*) appears in the
TF -> C++ table of docs/semantics.md, so the mapping stays complete as the seeds are the spec.

  check_tf_names.py --seeds DIR --doc docs/semantics.md"""
import argparse
import pathlib
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--doc", required=True)
    args = ap.parse_args()
    if not pathlib.Path(args.seeds).is_dir():
        print(f"check_tf_names: skipped: no seed directory {args.seeds} next to this checkout")
        return 77
    seeds = sorted(p for p in pathlib.Path(args.seeds).glob("*.txt"))
    if not seeds:
        print(f"check_tf_names: no seed documents (*.txt) in {args.seeds}", file=sys.stderr)
        return 1
    names = set()
    for seed in seeds:
        names.update(re.findall(r"tf\.(?:distribute|data)(?:\.[A-Za-z_][A-Za-z0-9_]*)+", seed.read_text(errors="replace")))
    doc = pathlib.Path(args.doc).read_text()
    missing = sorted(n for n in names if n not in doc)
    print(f"{len(names)} TF names in {len(seeds)} seed documents; {len(names) - len(missing)} in {args.doc}")
    for n in missing:
        print(f"missing from the table: {n}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
