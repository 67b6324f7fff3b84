#!/usr/bin/env python3
"""Differential conformance: the same randomised cases through TensorFlow 2.21 and through
distribute (case_runner.cpp, built against the single header), compared exactly (integers,
strings) or within a tight float tolerance. A disagreement fails the run unless the allow-list
(allow_list.json: each entry documented in docs/semantics.md) names it.

    tests/conformance/driver.py [--seed S] [--cases N] [--runner PATH | --include-dir DIR]

Without TensorFlow importable, the driver makes its own venv (DISTRIBUTE_TF_VENV, default
~/.cache/distribute-tf-venv) with tensorflow from PyPI, once, and re-runs itself there. Without
--runner it compiles case_runner.cpp against --include-dir (default: the repository's
single_include/) into ~/.cache/distribute-conformance/, keyed by the sources' hash."""
import argparse
import hashlib
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REQUIREMENTS = ["tensorflow==2.21.*", "safetensors==0.8.*"]
# Cases per area at --cases 2400 (scaled for other totals); TF's side costs most in values/dataset.
WEIGHTS = {"device": 0.27, "tf_config": 0.19, "partitioner": 0.18, "values": 0.1, "dataset": 0.025, "sharded": 0.065,
           "safetensors": 0.05, "sparse_reduce": 0.06, "scatter": 0.06}
# Areas whose TensorFlow-side value is read after the case runner ran (it writes the file).
AFTER_RUNNER = {"safetensors": lambda c: c["input"]["how"] == "write"}


def ensure_tensorflow():
    try:
        import safetensors  # noqa: F401
        import tensorflow  # noqa: F401
        return
    except ImportError:
        pass
    venv = Path(os.environ.get("DISTRIBUTE_TF_VENV", Path.home() / ".cache" / "distribute-tf-venv"))
    python = venv / "bin" / "python"
    if os.environ.get("DISTRIBUTE_CONFORMANCE_REEXEC"):
        sys.exit(f"conformance: tensorflow is not importable in {sys.executable} even after installing it")
    if not python.exists():
        print(f"conformance: creating {venv} with {' '.join(REQUIREMENTS)} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import tensorflow, safetensors"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    env = dict(os.environ, DISTRIBUTE_CONFORMANCE_REEXEC="1")
    os.execve(str(python), [str(python), str(Path(__file__).resolve())] + sys.argv[1:], env)


def build_runner(include_dir):
    sources = [HERE / "case_runner.cpp", HERE / "runner_areas.hpp"]
    digest = hashlib.sha256()
    for f in sources + sorted(p for p in Path(include_dir).rglob("*.hpp")):
        digest.update(str(f).encode())
        digest.update(f.read_bytes())
    cache = Path.home() / ".cache" / "distribute-conformance"
    cache.mkdir(parents=True, exist_ok=True)
    exe = cache / f"case_runner-{digest.hexdigest()[:16]}"
    if exe.exists():
        return exe
    cxx = os.environ.get("CXX", "c++")
    cmd = [*shlex.split(cxx), "-std=c++20", "-O1", "-I", str(include_dir), str(sources[0]), "-o", str(exe) + ".tmp",
           "-lfmt", "-lboost_json", "-lssl", "-lcrypto", "-pthread"]
    print("conformance: compiling the case runner:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    os.replace(str(exe) + ".tmp", exe)
    return exe


def close(a, b, rel):
    if isinstance(a, str) or isinstance(b, str):  # "nan", "inf", "-inf"
        return a == b
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def same(ours, theirs, rel):
    """Equal values: dicts and lists element by element, tensors within `rel` for floats."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if set(ours) != set(theirs):
            return False
        if "dtype" in ours and "values" in ours:
            tol = rel if ours["dtype"] == "float64" else max(rel, 2e-6 * 8)
            return (ours["dtype"] == theirs["dtype"] and ours["shape"] == theirs["shape"]
                    and len(ours["values"]) == len(theirs["values"])
                    and all(close(a, b, tol) for a, b in zip(ours["values"], theirs["values"])))
        return all(same(ours[k], theirs[k], rel) for k in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(same(a, b, rel) for a, b in zip(ours, theirs))
    if isinstance(ours, (int, float, str, bool)) or ours is None:
        return ours == theirs if not isinstance(ours, float) else close(ours, theirs, rel)
    return ours == theirs


def int_mean_truncates(ours, theirs):
    """Ours keeps an integer MEAN in the component type (truncating); TF's is float64."""
    def one(o, t):
        return (isinstance(o, dict) and o.get("dtype", "").startswith("int") and t.get("dtype") == "float64"
                and o["shape"] == t["shape"]
                and all(isinstance(b, float) and math.isfinite(b) and a == math.trunc(b)
                        for a, b in zip(o["values"], t["values"])))
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(one(o, t) for o, t in zip(ours, theirs))
    return one(ours, theirs)


def zero_rows_one_shard(ours, theirs):
    """Ours gives an axis of size 0 one shard where TF's FixedShardsPartitioner gives 0."""
    return isinstance(theirs, list) and ours == [max(1, x) for x in theirs]


CHECKS = {"int_mean_truncates": int_mean_truncates, "zero_rows_one_shard": zero_rows_one_shard}


def allowed(entry, area, kind, case, ours, theirs):
    if entry["area"] != area or entry["kind"] != kind:
        return False
    if "error" in entry and not (kind == "tf_accepts_ours_rejects" and re.search(entry["error"], ours)):
        return False
    if "tf_error" in entry and not (kind == "ours_accepts_tf_rejects" and re.search(entry["tf_error"], theirs)):
        return False
    if "input" in entry and not re.search(entry["input"], json.dumps(case)):
        return False
    if "check" in entry and not CHECKS[entry["check"]](ours, theirs):
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("DISTRIBUTE_CONFORMANCE_SEED", "23")))
    ap.add_argument("--cases", type=int, default=2400, help="total number of cases (at least 2000 in CI)")
    ap.add_argument("--areas", default=",".join(WEIGHTS), help="comma-separated areas")
    ap.add_argument("--runner", help="a built case runner (else compiled here)")
    ap.add_argument("--include-dir", default=str(REPO / "single_include"))
    ap.add_argument("--allow-list", default=str(HERE / "allow_list.json"))
    ap.add_argument("--show", type=int, default=15, help="disagreements to print")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is first imported
    ensure_tensorflow()
    sys.path.insert(0, str(HERE))
    start = time.monotonic()
    import tf_side  # noqa: E402 (TensorFlow is importable only now)

    runner = Path(args.runner) if args.runner else build_runner(Path(args.include_dir))
    allow = json.loads(Path(args.allow_list).read_text())["entries"]
    rng = random.Random(args.seed)
    areas = [a for a in args.areas.split(",") if a]
    weight = sum(WEIGHTS[a] for a in areas)
    cases = []
    scratch = tempfile.TemporaryDirectory(prefix="distribute-conformance-")
    for area in areas:
        gen, _ = tf_side.AREAS[area]
        extra = (scratch.name,) if area == "safetensors" else ()
        for inp in gen(rng, max(1, round(args.cases * WEIGHTS[area] / weight)), *extra):
            cases.append({"id": len(cases), "area": area, "input": inp})

    t0 = time.monotonic()
    theirs = {}
    # Cases that use a strategy of n > 1 replicas run in one process per n (see tf_side.py),
    # started first; the rest (n = 1 included) here meanwhile.
    groups = {}
    for c in cases:
        inp = c["input"] if isinstance(c["input"], dict) else {}
        if inp.get("replicas", 1) > 1:
            groups.setdefault(f"replicas-{inp['replicas']}", []).append(c)
        elif "num_ps" in inp:  # a ParameterServerStrategy connects its process to a cluster
            groups.setdefault(f"ps-{inp['num_ps']}", []).append(c)
    procs = []
    for _, group in sorted(groups.items()):
        proc = subprocess.Popen([sys.executable, str(HERE / "tf_side.py")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdin.write("".join(json.dumps(c) + "\n" for c in group))
        proc.stdin.close()
        procs.append((proc, group))
    elsewhere = {c["id"] for group in groups.values() for c in group}
    after = {c["id"] for c in cases if c["area"] in AFTER_RUNNER and AFTER_RUNNER[c["area"]](c)}
    for c in cases:
        if c["id"] not in elsewhere and c["id"] not in after:
            theirs[c["id"]] = tf_side.run_one(c)
    for proc, group in procs:
        for line in proc.stdout:
            i, ok, value = json.loads(line)
            theirs[i] = (ok, value)
        if proc.wait() != 0 or any(c["id"] not in theirs for c in group):
            sys.exit(f"conformance: the TensorFlow side failed (exit {proc.returncode})")
    t_tf = time.monotonic() - t0

    t0 = time.monotonic()
    proc = subprocess.run([str(runner)], input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"conformance: the case runner failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    ours = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    t_ours = time.monotonic() - t0
    for c in cases:
        if c["id"] in after:
            theirs[c["id"]] = tf_side.run_one(c)
    scratch.cleanup()

    stats = {}
    failures = []
    allowed_by = {}
    for c in cases:
        area = c["area"]
        st = stats.setdefault(area, {"cases": 0, "agree": 0, "allowed": 0, "fail": 0, "tf_rejects": 0})
        st["cases"] += 1
        tf_ok, tf_value = theirs[c["id"]]
        r = ours[c["id"]]
        st["tf_rejects"] += not tf_ok
        if r["ok"] and tf_ok:
            kind = None if same(r["value"], tf_value, 1e-9) else "value_differs"
        elif not r["ok"] and not tf_ok:
            kind = None
        else:
            kind = "tf_accepts_ours_rejects" if tf_ok else "ours_accepts_tf_rejects"
        if kind is None:
            st["agree"] += 1
            continue
        our_side = r.get("value") if r["ok"] else r["error"]
        entry = next((e for e in allow if allowed(e, area, kind, c["input"], our_side, tf_value)), None)
        if entry:
            st["allowed"] += 1
            allowed_by[entry["id"]] = allowed_by.get(entry["id"], 0) + 1
        else:
            st["fail"] += 1
            failures.append((c, kind, our_side, tf_value))

    total = len(cases)
    print(f"conformance: seed {args.seed}, {total} cases, TensorFlow {tf_side.tf.__version__}, "
          f"TF side {t_tf:.1f} s, ours {t_ours:.1f} s, total {time.monotonic() - start:.1f} s")
    for area, st in stats.items():
        print(f"  {area:12} {st['cases']:5} cases: {st['agree']:5} agree ({st['tf_rejects']} refused by TF), "
              f"{st['allowed']:4} allow-listed, {st['fail']:3} disagree")
    for k, n in sorted(allowed_by.items()):
        print(f"  allowed {k}: {n}")
    for c, kind, our_side, tf_value in failures[:args.show]:
        print(f"\nDISAGREE [{c['area']}] {kind}\n  input: {json.dumps(c['input'])[:400]}\n"
              f"  ours:  {json.dumps(our_side)[:400]}\n  TF:    {json.dumps(tf_value)[:400]}")
    if failures:
        print(f"\nconformance: {len(failures)} disagreement(s) not in {args.allow_list}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
