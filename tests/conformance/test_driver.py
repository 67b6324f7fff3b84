#!/usr/bin/env python3
"""Checks driver.py's comparison and allow-list rules on fixed values (no TensorFlow needed):
    python3 tests/conformance/test_driver.py"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import driver  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def tensor(dtype, shape, values):
    return {"dtype": dtype, "shape": shape, "values": values}


# Comparison: exact for integers and strings, tight for floats, NaN as the string "nan".
check(driver.same(tensor("int32", [2], [1, 2]), tensor("int32", [2], [1, 2]), 1e-9), "equal int tensors")
check(not driver.same(tensor("int32", [2], [1, 2]), tensor("int32", [2], [1, 3]), 1e-9), "different int tensors")
check(not driver.same(tensor("int32", [2], [1, 2]), tensor("int64", [2], [1, 2]), 1e-9), "different dtypes")
check(not driver.same(tensor("int32", [2], [1, 2]), tensor("int32", [1, 2], [1, 2]), 1e-9), "different shapes")
check(driver.same(tensor("float32", [1], [0.1 + 1e-7]), tensor("float32", [1], [0.1]), 1e-9), "float32 within 1.6e-5")
check(not driver.same(tensor("float32", [1], [0.1001]), tensor("float32", [1], [0.1]), 1e-9), "float32 beyond")
check(not driver.same(tensor("float64", [1], [0.1 + 1e-7]), tensor("float64", [1], [0.1]), 1e-9), "float64 is tighter")
check(driver.same(tensor("float32", [1], ["nan"]), tensor("float32", [1], ["nan"]), 1e-9), "NaN equals NaN")
check(not driver.same(tensor("float32", [1], ["nan"]), tensor("float32", [1], [0.0]), 1e-9), "NaN is not 0")
check(not driver.same({"a": 1}, {"a": 1, "b": 2}, 1e-9), "different keys")
check(driver.same({"job": None, "string": "/job:a"}, {"job": None, "string": "/job:a"}, 1e-9), "device dicts")
check(not driver.same([[1, 2]], [[1, 2], []], 1e-9), "different list lengths")

# The named rules an allow-list entry may require.
check(driver.int_mean_truncates(tensor("int32", [2], [2, -1]), tensor("float64", [2], [2.5, -1.5])),
      "int MEAN truncates toward zero")
check(not driver.int_mean_truncates(tensor("int32", [1], [3]), tensor("float64", [1], [2.5])), "not a truncation")
check(not driver.int_mean_truncates(tensor("int32", [1], [0]), tensor("float64", [1], ["nan"])), "NaN is no truncation")
check(driver.zero_rows_one_shard([1, 1], [0, 1]), "0 shards read as 1")
check(not driver.zero_rows_one_shard([2, 1], [0, 1]), "only 0 becomes 1")

# allowed(): kind, area and the regexes must all match.
entries = json.loads((Path(__file__).resolve().parent / "allow_list.json").read_text())["entries"]
by_id = {e["id"]: e for e in entries}
address = by_id["tf-config-address"]
ours = "TF_CONFIG: cluster.worker[0] address 'a' has no port; expected host:port"
check(driver.allowed(address, "tf_config", "tf_accepts_ours_rejects", "{}", ours, {}), "address entry matches")
check(not driver.allowed(address, "tf_config", "ours_accepts_tf_rejects", "{}", ours, "ValueError"), "kind must match")
check(not driver.allowed(address, "device", "tf_accepts_ours_rejects", "{}", ours, {}), "area must match")
check(not driver.allowed(address, "tf_config", "tf_accepts_ours_rejects", "{}", "TF_CONFIG: task.type is missing", {}),
      "message must match")
int_mean = by_id["values-int-mean"]
check(driver.allowed(int_mean, "values", "value_differs", {}, tensor("int64", [], [2]), tensor("float64", [], [2.5])),
      "int MEAN entry")
check(not driver.allowed(int_mean, "values", "value_differs", {}, tensor("int64", [], [3]), tensor("float64", [], [2.5])),
      "int MEAN entry needs the truncation")
shapes = by_id["sparse-reduce-dense-shapes"]
ours = ("all_reduce: value 0 is IndexedSlices of dense shape (3, 2) float32 on replica 0 but IndexedSlices of dense "
        "shape (4, 2) float32 on replica 1; every replica passes the same kinds, dtypes and shapes")
check(driver.allowed(shapes, "sparse_reduce", "tf_accepts_ours_rejects", {}, ours, {}), "dense shapes entry matches")
check(not driver.allowed(shapes, "sparse_reduce", "tf_accepts_ours_rejects", {},
                         ours.replace("dense shape (4, 2) float32", "dense shape (3, 2) float64"), {}),
      "dense shapes entry: not for another dtype")
scatter = by_id["scatter-dense-shape"]
check(driver.allowed(scatter, "scatter", "tf_accepts_ours_rejects", {},
                     "scatter_min: IndexedSlices of dense shape (7,) into variable 'v' of shape (5,)", {}),
      "scatter dense shape entry matches")
check(not driver.allowed(scatter, "scatter", "tf_accepts_ours_rejects", {},
                         "scatter_add: rows of shape (3,) into variable 'v', whose rows have shape (2,)", {}),
      "scatter dense shape entry: not for another row width")
# IndexedSlices compare as their parts: indices exactly, values as a tensor.
slices = {"indices": [0, 2], "values": tensor("float32", [2], [0.1, 2.0]), "dense_shape": [3]}
check(driver.same(slices, {**slices, "values": tensor("float32", [2], [0.1 + 1e-7, 2.0])}, 1e-9), "slices' values")
check(not driver.same(slices, {**slices, "indices": [2, 0]}, 1e-9), "slices' indices in order")

for e in entries:
    check(e.get("doc") and e["kind"] in ("tf_accepts_ours_rejects", "ours_accepts_tf_rejects", "value_differs"),
          f"entry {e['id']} has a doc and a known kind")
    check("check" not in e or e["check"] in driver.CHECKS, f"entry {e['id']} names a known check")

for f in failures:
    print("FAIL:", f)
print(f"test_driver: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
