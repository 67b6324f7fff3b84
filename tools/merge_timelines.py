#!/usr/bin/env python3
"""Merges the timelines of a job's tasks (DISTRIBUTE_TIMELINE, one Chrome trace-event file per
task) into one file that Perfetto (ui.perfetto.dev) or chrome://tracing opens, one process per task.

Usage: merge_timelines.py OUT.json TASK.json [TASK.json ...]
       merge_timelines.py OUT.json 'timeline.*.json'      (a pattern, quoted, is expanded here)

Each task's events keep their threads; the task becomes the process (pid 1, 2, ... in the order
chief, worker, ps, then by index; named "worker:1"). Times are aligned on the wall clock that each
file records (otherData.wall_minus_steady_us), so tasks on different hosts line up as well as
their clocks agree, and shifted so that the job starts at 0.
"""
import glob
import json
import sys

TASK_ORDER = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}


def load(path):
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a timeline (no traceEvents list)")
    other = data.get("otherData") or {}
    return {
        "path": path,
        "task_type": str(other.get("task_type", "task")),
        "task_index": int(other.get("task_index", 0)),
        # In integer nanoseconds: wall-clock microseconds (~1.8e15) plus a ts lose digits as floats.
        "offset_ns": int(other.get("wall_minus_steady_us", 0)) * 1000,
        "events": data["traceEvents"],
    }


def merge(paths):
    tasks = [load(p) for p in paths]
    tasks.sort(key=lambda t: (TASK_ORDER.get(t["task_type"], 9), t["task_type"], t["task_index"]))
    seen = set()
    for t in tasks:
        key = (t["task_type"], t["task_index"])
        if key in seen:
            raise ValueError(f"two files for task {key[0]}:{key[1]} ({t['path']})")
        seen.add(key)
    starts = [t["offset_ns"] + round(e["ts"] * 1000) for t in tasks for e in t["events"] if e.get("ph") != "M" and "ts" in e]
    origin = min(starts) if starts else 0
    out = []
    for pid, t in enumerate(tasks, start=1):
        name = f"{t['task_type']}:{t['task_index']}"
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for e in t["events"]:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                continue  # replaced by ours
            e = dict(e)
            e["pid"] = pid
            if "ts" in e and e.get("ph") != "M":
                e["ts"] = (round(e["ts"] * 1000) + t["offset_ns"] - origin) / 1000
            out.append(e)
    return {"displayTimeUnit": "ms", "otherData": {"tasks": [f"{t['task_type']}:{t['task_index']}" for t in tasks]},
            "traceEvents": out}


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    paths = []
    for a in argv[2:]:
        found = sorted(glob.glob(a)) if any(c in a for c in "*?[") else [a]
        if not found:
            print(f"merge_timelines: no file matches '{a}'", file=sys.stderr)
            return 2
        paths += found
    try:
        merged = merge(paths)
    except (OSError, ValueError) as e:
        print(f"merge_timelines: {e}", file=sys.stderr)
        return 1
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(merged, f, separators=(",", ":"))
    print(f"merge_timelines: {len(paths)} tasks, {len(merged['traceEvents'])} events -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
