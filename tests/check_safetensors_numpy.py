#!/usr/bin/env python3
"""Interop check against the reference implementation: Python's `safetensors` with numpy, and
ml_dtypes for bfloat16 (numpy has no bfloat16 of its own).

Usage: check_safetensors_numpy.py <checkpoint_helper>

The packages are installed from PyPI into a virtual environment that is created once and reused
(~/.cache/distribute-venv/<key>, or $DISTRIBUTE_PYTHON_VENV; the key changes with the Python and
the pinned versions below). Where it cannot be created (no venv module, no network, no wheel for
this Python) the script prints why and exits 77, which meson reports as SKIP.

Inside the environment:
1. safetensors.numpy.load_file reads what the helper wrote (tensors.safetensors: every dtype,
   ranks 0-4; ckpt-1.safetensors: a ds::Checkpoint with float16 and bfloat16 variables); every
   value matches the formulas of checkpoint_helper.cpp, F16 as numpy.float16 and BF16 as
   ml_dtypes.bfloat16, bit for bit (NaN, -0, inf, subnormals included).
2. safetensors.numpy.save_file writes float16 and bfloat16 arrays (and a float32 and an int64 one);
   the helper reads them with the safetensors reader and through ds::Checkpoint, bit for bit.
"""
import fcntl
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The helper's values, and how to run it, are check_safetensors.py's (this file's directory).
from check_safetensors import (BF16_BITS, BF16_VALUES, F16_BITS, F16_VALUES, SHAPES, Failure, check,
                               expected, run_helper)

# Pinned so that a run is reproducible; a new pin makes a new environment.
REQUIREMENTS = ["numpy==2.4.6", "safetensors==0.8.0", "ml_dtypes==0.6.0"]
SKIP = 77

INTEGER_DTYPES = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
                  "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64"}


# ---- the environment ----------------------------------------------------------------------------

def venv_path(requirements=REQUIREMENTS):
    key = hashlib.sha256("\n".join([sys.base_prefix, sys.version, *requirements]).encode()).hexdigest()[:12]
    if os.environ.get("DISTRIBUTE_PYTHON_VENV"):
        # That one holds REQUIREMENTS; another list gets an environment beside it.
        base = Path(os.environ["DISTRIBUTE_PYTHON_VENV"])
        return base if requirements == REQUIREMENTS else base.with_name(f"{base.name}-{key}")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "distribute-venv" / f"py{sys.version_info.major}.{sys.version_info.minor}-{key}"


def run_logged(command, timeout):
    """Runs a set-up command; returns None, or why it failed (the end of its output)."""
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(map(str, command))}: {e}"
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        return f"{' '.join(map(str, command))} exited with {r.returncode}:\n{tail}"
    return None


def ensure_venv(requirements=REQUIREMENTS):
    """Returns (python of the environment, None) or (None, why it could not be made)."""
    venv = venv_path(requirements)
    python = venv / "bin" / "python"
    marker = venv / "distribute-requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        # Several builds (plain, sanitizers) may run this test at once: one of them installs.
        with open(venv.parent / f"{venv.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if marker.is_file() and marker.read_text() == wanted and python.exists():
                return python, None
            shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
            print(f"creating {venv} with {' '.join(requirements)}", flush=True)
            problem = run_logged([sys.executable, "-m", "venv", str(venv)], 120)
            if problem is None:
                problem = run_logged([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                      "--no-input", "-q", *requirements], 600)
            if problem is not None:
                shutil.rmtree(venv, ignore_errors=True)
                return None, problem
            marker.write_text(wanted)  # last: its presence means the environment is complete
            return python, None
    except OSError as e:
        return None, f"{venv}: {e}"


# ---- the checks (run inside the environment) ----------------------------------------------------

def check_we_read_distribute_files(helper, tmp):
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import load_file

    numpy_dtype = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64,
                   "BOOL": np.bool_, **{k: np.dtype(v) for k, v in INTEGER_DTYPES.items()}}
    run_helper(helper, "write", tmp)
    tensors = load_file(os.path.join(tmp, "tensors.safetensors"))
    check(set(tensors) == {f"{d}_r{r}" for d in numpy_dtype for r in range(len(SHAPES))},
          f"tensors.safetensors: keys {sorted(tensors)}")
    for dtype, np_dtype in numpy_dtype.items():
        for rank, shape in enumerate(SHAPES):
            name = f"{dtype}_r{rank}"
            a = tensors[name]
            check(a.dtype == np.dtype(np_dtype), f"{name}: numpy dtype {a.dtype}, expected {np.dtype(np_dtype)}")
            check(list(a.shape) == shape, f"{name}: shape {a.shape}")
            want = [expected(dtype, i) for i in range(math.prod(shape))]
            flat = a.reshape(-1)
            got = (flat.view(np.uint16) if dtype in ("F16", "BF16") else flat).tolist()
            check(got == want, f"{name}: {got} != {want}")

    ckpt = load_file(os.path.join(tmp, "ckpt-1.safetensors"))
    check(ckpt["embedding"].shape == (5, 2), "ckpt-1: embedding")
    for name, np_dtype, shape, values, bits in [
        ("half/f16", np.float16, (2, 5), F16_VALUES, F16_BITS),
        ("half/bf16", ml_dtypes.bfloat16, (10,), BF16_VALUES, BF16_BITS),
    ]:
        a = ckpt[name]
        check(a.dtype == np.dtype(np_dtype), f"ckpt-1: {name} has numpy dtype {a.dtype}")
        check(a.shape == shape, f"ckpt-1: {name} has shape {a.shape}")
        got = a.reshape(-1).view(np.uint16).tolist()
        check(got == bits, f"ckpt-1: {name} bits {[hex(b) for b in got]} != {[hex(b) for b in bits]}")
        # The same values as numpy (ml_dtypes) rounds them from the floats the variables were made of.
        theirs = np.array(values, dtype=np_dtype)
        check(theirs.view(np.uint16).tolist() == bits, f"{name}: numpy rounds {values} to other bits")
        check(np.array_equal(a.reshape(-1).astype(np.float64), theirs.astype(np.float64), equal_nan=True),
              f"ckpt-1: {name} values {a.reshape(-1).tolist()} != {theirs.tolist()}")
        check(bool(np.signbit(a.reshape(-1)[1])), f"ckpt-1: {name}[1] is not -0")
    for name, np_dtype, value in [("half/f16_scalar", np.float16, -1.5), ("half/bf16_scalar", ml_dtypes.bfloat16, 0.5)]:
        a = ckpt[name]
        check(a.dtype == np.dtype(np_dtype) and a.shape == () and float(a) == value, f"ckpt-1: {name} = {a!r}")
    print("ok: safetensors.numpy reads our files: every dtype, float16 as numpy.float16, bfloat16 as "
          "ml_dtypes.bfloat16, bit for bit")


def check_distribute_reads_their_files(helper, tmp):
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    f16 = np.array(F16_VALUES, dtype=np.float16).reshape(2, 5)
    # A signalling NaN and a negative NaN, which only a bit-exact reader keeps.
    bf16 = np.concatenate([np.array(BF16_VALUES[:8], dtype=ml_dtypes.bfloat16),
                           np.array([0x7F81, 0xFFC0], dtype=np.uint16).view(ml_dtypes.bfloat16)])
    tensors = {
        "f16": f16, "bf16": bf16, "bf16_scalar": np.array(-0.0, dtype=ml_dtypes.bfloat16),
        "x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([7], dtype=np.int64),
    }
    path = os.path.join(tmp, "by_reference.safetensors")
    save_file(tensors, path, metadata={"k": "v"})

    lines = run_helper(helper, "dump", path).splitlines()
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines if not line.startswith("@")}
    check("@k=v" in lines, f"dump: metadata {lines}")
    check(got.get("x") == ["F32", "2,3", "0,1,2,3,4,5"] and got.get("y") == ["I64", "1", "7"], f"dump: {lines}")
    for name, dtype in [("f16", "F16"), ("bf16", "BF16"), ("bf16_scalar", "BF16")]:
        a = tensors[name]
        want = [dtype, ",".join(map(str, a.shape)), ",".join(map(str, a.reshape(-1).view(np.uint16).tolist()))]
        check(got.get(name) == want, f"dump: {name} is {got.get(name)}, expected {want}")

    restored = dict(line.split("|") for line in run_helper(helper, "restore-half", path).splitlines())
    for name in ("f16", "bf16", "bf16_scalar"):
        want = ",".join(map(str, tensors[name].reshape(-1).view(np.uint16).tolist()))
        check(restored.get(name) == want, f"ds::Checkpoint restored {name} as {restored.get(name)}, expected {want}")
    print("ok: we read files written by safetensors.numpy (float16, bfloat16 via ml_dtypes), bit for bit, "
          "also through ds::Checkpoint")


def checks(helper):
    with tempfile.TemporaryDirectory(prefix="distribute-numpy-") as tmp:
        try:
            check_we_read_distribute_files(helper, tmp)
            check_distribute_reads_their_files(helper, tmp)
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
    return 0


def run_in_venv(script, doc, checks, requirements=REQUIREMENTS):
    """`script <helper>` re-runs itself in the environment (`--in-venv <helper>`), where `checks` runs.
    Each list of `requirements` has its own environment."""
    if len(sys.argv) == 3 and sys.argv[1] == "--in-venv":
        return checks(sys.argv[2])
    if len(sys.argv) != 2:
        print(doc)
        return 2
    python, problem = ensure_venv(requirements)
    if python is None:
        print(f"SKIP: no Python environment with {' '.join(requirements)}: {problem}")
        return SKIP
    helper = os.path.abspath(sys.argv[1])
    return subprocess.run([str(python), os.path.abspath(script), "--in-venv", helper]).returncode


def main():
    return run_in_venv(__file__, __doc__, checks)


if __name__ == "__main__":
    sys.exit(main())
