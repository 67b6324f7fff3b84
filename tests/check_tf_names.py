#!/usr/bin/env python3
"""Every TensorFlow name the seed documents mention (every dotted `tf.` name: tf.distribute.*,
tf.data.*, tf.train.*, tf.keras.*, tf.Variable, ...) has a row in the TF -> C++ table of
docs/semantics.md (the "## Name mapping" section), either naming our counterpart or saying why
there is none, so the mapping stays complete as the seeds are the spec.

A name counts as present when it appears in a table row as a whole name: `tf.distribute` is not
satisfied by `tf.distribute.Strategy`, nor `tf.Variable` by `tf.VariableSynchronization`.

  check_tf_names.py --seeds DIR --doc docs/semantics.md"""
import argparse
import pathlib
import re
import sys

NAME = re.compile(r"(?<![A-Za-z0-9_.])tf(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def table_rows(doc: str) -> list:
    """The rows of the table under "## Name mapping" (up to the next "## " heading)."""
    rows, inside = [], False
    for line in doc.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Name mapping"
            continue
        if inside and line.startswith("|"):
            rows.append(line)
    return rows


def has_row(name: str, rows: list) -> bool:
    whole = re.compile(r"(?<![A-Za-z0-9_.])" + re.escape(name) + r"(?![A-Za-z0-9_]|\.[A-Za-z_])")
    return any(whole.search(row) for row in rows)


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
        names.update(NAME.findall(seed.read_text(errors="replace")))
    rows = table_rows(pathlib.Path(args.doc).read_text())
    if not rows:
        print(f"check_tf_names: {args.doc} has no table under '## Name mapping'", file=sys.stderr)
        return 1
    missing = sorted(n for n in names if not has_row(n, rows))
    print(f"{len(names)} TF names in {len(seeds)} seed documents; {len(names) - len(missing)} have a row in "
          f"{args.doc} ({len(rows) - 2} rows)")
    for n in missing:
        print(f"missing from the table: {n}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
