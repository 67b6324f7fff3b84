#!/usr/bin/env python3
"""Timelines of real 2-worker MultiWorkerMirrored jobs that fail, checked against the Chrome
trace-event format, then merged by tools/merge_timelines.py.

Usage: check_timeline.py <observability_helper> <merge_timelines.py>

1. mismatch: after 3 all-reduces worker 0 all-reduces and worker 1 broadcasts: both exit with
   InvalidArgument; each file holds 4 "run" steps, 3 all_reduce spans with their bytes and
   algorithm, and the failed call with the library's mismatch message.
2. kill: after 3 all-reduces of 400000 bytes worker 1 SIGKILLs itself; worker 0's file is valid
   JSON and shows its last all_reduce failed (the third or the fourth: worker 0 may still have
   been finishing the third); worker 1's file (written when its timeline started) is valid too.
3. a one-worker job (no TF_CONFIG) records its run steps; an unwritable DISTRIBUTE_TIMELINE and a
   DISTRIBUTE_METRICS_PORT out of range stop the strategy's constructor with InvalidArgument.
The format: valid JSON; every event has name/ph/pid/tid; only X (complete, dur >= 0), i and M
phases, and b/e (async spans: each b has one e of the same cat, id and name, not before it);
ts non-decreasing per thread; X spans on a thread nest (no partial overlap).

Usage: check_timeline.py <ps_helper> <merge_timelines.py>: the parameter-server chief instead
(check_metrics_prometheus.run_coordinator_job: 1 ps, 2 workers, 40 closures of 50 ms, worker 1
SIGKILLed and restarted) with DISTRIBUTE_TIMELINE: chief-0's file has each closure as an async
span (schedule() to its end) with its worker and outcome ok, each attempt as a span on its
worker's dispatcher thread (the lost ones with outcome worker_lost, as many as the chief
retried), "worker lost" and "worker back" instant events for worker 1, in that order; it merges.
An unwritable DISTRIBUTE_TIMELINE and a bad DISTRIBUTE_METRICS_PORT: tests/test_ps_cluster.cpp.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_metrics_prometheus import Failure, check, free_ports  # noqa: E402

HELPER = None
MERGE = None


def run_job(scenario, tmp):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(2):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        env["DISTRIBUTE_TIMELINE"] = os.path.join(tmp, f"{scenario}.json")
        env.pop("DISTRIBUTE_METRICS_PORT", None)
        procs.append(subprocess.Popen([HELPER, scenario], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise Failure(f"{scenario}: a worker did not finish within 120 s")
        outs.append((p.returncode, out))
    return outs, [os.path.join(tmp, f"{scenario}.worker-{i}.json") for i in range(2)]


def check_format(path):
    """Loads a trace file and checks the trace-event rules; returns its events."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise Failure(f"{path}: not valid JSON: {e}")
    events = data.get("traceEvents")
    check(isinstance(events, list), f"{path}: no traceEvents list")
    last_ts = {}
    open_spans = {}
    async_open, async_done = {}, set()
    for e in events:
        for key in ("name", "ph", "pid", "tid"):
            check(key in e, f"{path}: event without {key}: {e}")
        ph = e["ph"]
        check(ph in ("X", "i", "M", "b", "e"), f"{path}: unexpected phase {ph} (B/E pairs are not used): {e}")
        if ph == "M":
            continue
        check(isinstance(e.get("ts"), (int, float)), f"{path}: event without a numeric ts: {e}")
        thread = (e["pid"], e["tid"])
        check(e["ts"] >= last_ts.get(thread, float("-inf")), f"{path}: ts goes back on thread {thread}: {e}")
        last_ts[thread] = e["ts"]
        if ph in ("b", "e"):
            check("id" in e and "cat" in e, f"{path}: async event without id or cat: {e}")
            key = (e["pid"], e["cat"], e["id"], e["name"])
            if ph == "b":
                check(key not in async_open and key not in async_done, f"{path}: async span begun twice: {e}")
                async_open[key] = e["ts"]
            else:
                check(key in async_open and e["ts"] >= async_open[key], f"{path}: async end without its begin: {e}")
                async_done.add(key)
                del async_open[key]
        if ph == "X":
            check(isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, f"{path}: X event without dur >= 0: {e}")
            # In whole nanoseconds: the file's microseconds have 3 decimals, which floats do not add exactly.
            start, end = round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)
            stack = open_spans.setdefault(thread, [])
            while stack and stack[-1] <= start:
                stack.pop()
            # Inside the enclosing span, or it overlaps it partially (a broken nesting).
            if stack:
                check(end <= stack[-1], f"{path}: span overlaps its parent partially: {e}")
            stack.append(end)
    check(not async_open, f"{path}: async spans never ended: {sorted(async_open)}")
    return events


def spans(events, name):
    return [e for e in events if e.get("ph") == "X" and e["name"] == name]


def check_mismatch(tmp):
    outs, files = run_job("mismatch", tmp)
    for i, (rc, out) in enumerate(outs):
        check(rc == 4 and "mismatched collectives" in out,
              f"mismatch: worker {i} exited {rc} (want 4, InvalidArgument):\n{out}")
    for i, path in enumerate(files):
        events = check_format(path)
        runs = spans(events, "run")
        check(len(runs) == 4, f"{path}: {len(runs)} run steps, expected 4")
        check([r["args"].get("step") for r in runs] == [0, 1, 2, 3], f"{path}: run steps {runs}")
        reduces = [e for e in spans(events, "all_reduce") if "error" not in e["args"]]
        check(len(reduces) == 3, f"{path}: {len(reduces)} successful all_reduce spans, expected 3")
        for r in reduces:
            # One host: every all-reduce goes through shared memory (shared_memory_min_bytes defaults to 1).
            check(r["args"]["bytes"] == 4000 and r["args"]["algorithm"] == "shared_memory",
                  f"{path}: all_reduce args {r['args']} (want 4000 bytes, shared_memory)")
            check(r["args"]["sent"] == 4000 and r["args"]["received"] == 4000, f"{path}: bytes moved {r['args']}")
            check("wait_for_peers_us" in r["args"] and "transfer_us" in r["args"], f"{path}: no wait/transfer split")
        kind = "all_reduce" if i == 0 else "broadcast"
        failed = [e for e in spans(events, kind) if "error" in e["args"]]
        check(len(failed) == 1 and "mismatched collectives" in failed[0]["args"]["error"],
              f"{path}: the failed {kind} is not recorded with the mismatch: {failed}")
        check(any(e["ph"] == "i" and "failed" in e["name"] for e in events), f"{path}: no failure instant event")
    print("ok: mismatch timelines (4 steps, 3 all-reduces with bytes and algorithm, the failed call with its error)")
    return files


def check_kill(tmp):
    outs, files = run_job("kill", tmp)
    rc0, out0 = outs[0]
    check(rc0 == 3 and "PeerFailure" in out0, f"kill: worker 0 exited {rc0} (want 3, PeerFailure):\n{out0}")
    check(outs[1][0] < 0, f"kill: worker 1 exited {outs[1][0]}, expected to die by SIGKILL")
    events = check_format(files[0])
    reduces = spans(events, "all_reduce")
    # Worker 1 dies after its third all-reduce returned; worker 0's third may still have been
    # finishing (then it is the one that fails) or done (then its fourth fails).
    check(len(reduces) in (3, 4), f"{files[0]}: {len(reduces)} all_reduce spans, expected 3 or 4")
    check(all(r["args"]["bytes"] == 400000 for r in reduces), f"{files[0]}: all_reduce bytes {reduces}")
    check("error" in reduces[-1]["args"] and all("error" not in r["args"] for r in reduces[:-1]),
          f"{files[0]}: the failure is not the last all_reduce, or not only it: {reduces}")
    check(any(e["ph"] == "i" for e in events), f"{files[0]}: no failure instant event")
    check_format(files[1])  # the killed worker's file: valid, whatever it holds
    print("ok: kill timelines (worker 0 shows the failed all-reduce; both files valid JSON)")
    return files


def check_merge(files, tmp, name):
    out = os.path.join(tmp, f"{name}-merged.json")
    r = subprocess.run([sys.executable, MERGE, out, *files], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"merge_timelines.py failed ({r.returncode}): {r.stderr}")
    events = check_format(out)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    check(names == {1: "worker:0", 2: "worker:1"}, f"{out}: processes {names}")
    per_pid = {}
    for e in events:
        if e["ph"] == "X" and e["name"] == "run":
            per_pid[e["pid"]] = per_pid.get(e["pid"], 0) + 1
    check(per_pid.get(1, 0) >= 3, f"{out}: worker:0 has {per_pid.get(1, 0)} run steps")
    check(min(e["ts"] for e in events if e["ph"] != "M") >= 0, f"{out}: negative ts after alignment")
    print(f"ok: {name} files merged into one trace, a process per task")


def check_merge_chief(files, tmp):
    out = os.path.join(tmp, "chief-merged.json")
    r = subprocess.run([sys.executable, MERGE, out, *files], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"merge_timelines.py failed ({r.returncode}): {r.stderr}")
    events = check_format(out)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    check(names == {1: "chief:0"}, f"{out}: processes {names}")
    check(sum(e["ph"] == "b" for e in events) == 40, f"{out}: closures lost in the merge")
    print("ok: the chief's timeline merges")


def check_merge_errors(tmp):
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write("{\"traceEvents\": [")
    r = subprocess.run([sys.executable, MERGE, os.path.join(tmp, "o.json"), bad], capture_output=True, text=True)
    check(r.returncode == 1 and "bad.json" in r.stderr, f"a truncated file: {r.returncode} {r.stderr}")
    r = subprocess.run([sys.executable, MERGE, os.path.join(tmp, "o.json"), os.path.join(tmp, "none-*.json")],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "no file matches" in r.stderr, f"a pattern matching nothing: {r.returncode} {r.stderr}")
    print("ok: merge_timelines.py refuses a truncated file and a pattern that matches nothing")


def check_bad_settings(tmp):
    """A one-worker job (no TF_CONFIG) still records its steps; bad settings stop the strategy's constructor."""
    env = dict(os.environ, TF_CONFIG="", DISTRIBUTE_TIMELINE=os.path.join(tmp, "single.json"))
    env.pop("DISTRIBUTE_METRICS_PORT", None)
    r = subprocess.run([HELPER, "mismatch"], env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"one worker: exit {r.returncode}: {r.stdout}")
    events = check_format(os.path.join(tmp, "single.worker-0.json"))
    check(len(spans(events, "run")) == 4, f"one worker: {len(spans(events, 'run'))} run steps, expected 4")
    env["DISTRIBUTE_TIMELINE"] = os.path.join(tmp, "no-such-dir", "t.json")
    r = subprocess.run([HELPER, "mismatch"], env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 4 and "timeline: cannot write" in r.stdout and "no-such-dir/t.worker-0.json" in r.stdout,
          f"an unwritable DISTRIBUTE_TIMELINE: exit {r.returncode}: {r.stdout}")
    env["DISTRIBUTE_TIMELINE"] = ""
    env["DISTRIBUTE_METRICS_PORT"] = "99999"
    r = subprocess.run([HELPER, "mismatch"], env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 4 and "DISTRIBUTE_METRICS_PORT='99999' is not a port number" in r.stdout,
          f"a bad DISTRIBUTE_METRICS_PORT: exit {r.returncode}: {r.stdout}")
    print("ok: a one-worker job records its steps; an unwritable timeline and a bad metrics port are InvalidArgument")


def check_coordinator(tmp):
    from check_metrics_prometheus import PS_CLOSURES, run_coordinator_job
    path = os.path.join(tmp, "coord.json")
    stats = {}
    run_coordinator_job(HELPER, {"DISTRIBUTE_TIMELINE": path}, lambda port, s: stats.update(s=s))
    counter, retried, _ = stats["s"]
    check(counter == PS_CLOSURES and retried > 0, f"coordinator: counter {counter}, {retried} retried")
    file = os.path.join(tmp, "coord.chief-0.json")
    events = check_format(file)
    closures = [e for e in events if e["ph"] == "b" and e["cat"] == "closure"]
    check(sorted(e["args"]["closure"] for e in closures) == list(range(1, PS_CLOSURES + 1)),
          f"{file}: closure spans {[e['args'].get('closure') for e in closures]}")
    check(all(e["name"] == "slow_add_one" and e["args"]["outcome"] == "ok" and e["args"]["worker"] in (0, 1)
              for e in closures), f"{file}: closure span args {[e['args'] for e in closures]}")
    attempts = [e for e in events if e["ph"] == "X" and e["cat"] == "closure_attempt"]
    ok = [a for a in attempts if a["args"]["outcome"] == "ok"]
    lost = [a for a in attempts if a["args"]["outcome"] == "worker_lost"]
    check(len(ok) == PS_CLOSURES and len(lost) == retried and len(attempts) == len(ok) + len(lost),
          f"{file}: {len(ok)} ok and {len(lost)} lost attempts of {len(attempts)} (retried {retried})")
    check(all(a["args"]["worker"] == 1 and a["args"]["error"] for a in lost), f"{file}: lost attempts {lost}")
    # Each dispatcher thread runs one worker's closures, one at a time.
    for a in attempts:
        check(all(b["args"]["worker"] == a["args"]["worker"] for b in attempts if b["tid"] == a["tid"]),
              f"{file}: attempts of two workers on thread {a['tid']}")
    # A closure's span holds its last attempt, on the same worker.
    begin = {e["args"]["closure"]: e for e in closures}
    for a in ok:
        b = begin[a["args"]["closure"]]
        check(b["ts"] <= a["ts"] and b["args"]["worker"] == a["args"]["worker"], f"{file}: attempt {a} outside {b}")
    instants = [(e["name"], e["args"].get("worker")) for e in sorted(events, key=lambda e: e.get("ts", 0))
                if e["ph"] == "i"]
    check(instants == [("worker lost", 1), ("worker back", 1)], f"{file}: instant events {instants}")
    print(f"ok: the chief's timeline: {PS_CLOSURES} closures as async spans, {len(attempts)} attempts "
          f"({len(lost)} lost with worker 1), worker lost and back")
    return [file]


def main():
    global HELPER, MERGE
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    HELPER, MERGE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.path.basename(HELPER).startswith("ps_helper"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory(prefix="distribute-timeline-") as tmp:
            try:
                files = check_coordinator(tmp)
                check_merge_chief(files, tmp)
            except Failure as e:
                print(f"FAIL: {e}")
                return 1
        return 0
    with tempfile.TemporaryDirectory(prefix="distribute-timeline-") as tmp:
        try:
            check_merge(check_mismatch(tmp), tmp, "mismatch")
            check_merge(check_kill(tmp), tmp, "kill")
            check_merge_errors(tmp)
            check_bad_settings(tmp)
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
