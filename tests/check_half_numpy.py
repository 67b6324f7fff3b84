#!/usr/bin/env python3
"""float16/bfloat16 all-reduce results against numpy's (ml_dtypes for bfloat16).

Usage: check_half_numpy.py <tensors_helper>

Random 16-bit values (seeded; normal, subnormal and large magnitudes, NaN and inf among them) on 2, 3
and 4 replicas go through MirroredStrategy<host>'s all-reduce (tests/tensors_helper.cpp) and through
numpy, and must agree bit for bit (every NaN counts as equal to every NaN):
- float16 MEAN: numpy's own `np.mean(replicas, axis=0)`, which for float16 sums in float32 and
  rounds once at the end, as the library promises;
- float16 SUM: `replicas.astype(float32).sum(axis=0).astype(float16)`;
- bfloat16 SUM and MEAN: the same float32 sum (and division) rounded once to ml_dtypes.bfloat16
  (numpy's mean of bfloat16 itself would add in bfloat16, rounding every step).
Replica sums are done in replica order, as numpy's reduction over axis 0 does.

Runs in the virtual environment of check_safetensors_numpy.py (created once from PyPI); exits 77
(SKIP) where it cannot be made.
"""
import os
import struct
import subprocess
import sys
import tempfile

from check_safetensors_numpy import run_in_venv


def run_case(helper, tmp, op, dtype, replicas, n, rng):
    import ml_dtypes
    import numpy as np

    np_dtype = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    # Magnitudes from tiny to large, signs mixed; a few NaN and inf.
    scale = np.exp2(rng.integers(-20, 12, size=(replicas, n))).astype(np.float32)
    values = (rng.standard_normal((replicas, n)).astype(np.float32) * scale).astype(np_dtype)
    values[0, :3] = np.array([np.nan, np.inf, -np.inf], dtype=np.float32).astype(np_dtype)
    inp = os.path.join(tmp, "in.bin")
    out = os.path.join(tmp, "out.bin")
    with open(inp, "wb") as f:
        f.write(struct.pack("<II", replicas, n))
        f.write(values.view(np.uint16).astype("<u2").tobytes())
    r = subprocess.run([helper, op, dtype, inp, out], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tensors_helper {op} {dtype}: {r.stderr.strip()}")
    ours = np.fromfile(out, dtype="<u2").view(np_dtype)

    if dtype == "f16" and op == "mean":
        want = np.mean(values, axis=0)
    else:
        total = values.astype(np.float32).sum(axis=0)
        want = (total / np.float32(replicas) if op == "mean" else total).astype(np_dtype)
    assert want.dtype == np.dtype(np_dtype), want.dtype
    same = (ours.view(np.uint16) == want.view(np.uint16)) | (np.isnan(ours.astype(np.float32)) &
                                                               np.isnan(want.astype(np.float32)))
    bad = np.flatnonzero(~same)
    if bad.size:
        i = int(bad[0])
        return (f"{dtype} {op} on {replicas} replicas: {bad.size} of {n} differ; first at {i}: "
                f"inputs {values[:, i].astype(np.float32).tolist()}, ours {float(ours[i])} "
                f"(0x{int(ours.view(np.uint16)[i]):04x}), numpy {float(want[i])} (0x{int(want.view(np.uint16)[i]):04x})")
    return None


def checks(helper):
    import numpy as np

    rng = np.random.default_rng(20261125)
    failures = []
    with tempfile.TemporaryDirectory(prefix="distribute-half-") as tmp:
        for dtype in ("f16", "bf16"):
            for op in ("sum", "mean"):
                for replicas in (2, 3, 4):
                    problem = run_case(helper, tmp, op, dtype, replicas, 5000, rng)
                    if problem:
                        failures.append(problem)
                    else:
                        print(f"ok: {dtype} {op} on {replicas} replicas, 5000 values, bit for bit with numpy")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


def main():
    return run_in_venv(__file__, __doc__, checks)


if __name__ == "__main__":
    sys.exit(main())
