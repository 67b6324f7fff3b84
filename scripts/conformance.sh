#!/usr/bin/env bash
# The TensorFlow conformance suite (tests/conformance/): the same randomised cases through
# TensorFlow 2.21 (a venv made once, ~/.cache/distribute-tf-venv or $DISTRIBUTE_TF_VENV) and
# through distribute's single header; fails on a disagreement that allow_list.json does not name.
#   bash scripts/conformance.sh [--seed S] [--cases N] [--include-dir include] [--areas device,...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec python3 "$ROOT/tests/conformance/driver.py" "$@"
