#!/usr/bin/env python3
"""GET /metrics of both workers of a real 2-worker MultiWorkerMirrored job, parsed by Prometheus's
own Python client (prometheus_client.parser), with the counts the job's calls must give.

Usage: check_metrics_prometheus.py <observability_helper>

prometheus_client is installed from PyPI into a virtual environment made once and reused (the
driver of check_safetensors_numpy.py); where it cannot be made (no network...) this exits 77: SKIP.

Each worker runs 5 all-reduces of 1000 floats (4000 bytes: the direct algorithm, which sends
the whole buffer to the other worker and receives its) and 1 broadcast of 1000 floats from
worker 1, with DISTRIBUTE_METRICS_PORT=P: worker i serves on 127.0.0.1:P+i. Then, on each:
 - every series carries task_type="worker" and task_index=i, and no label named job;
 - distribute_collectives_total{kind="all_reduce"} 5, {kind="broadcast"} 1, failed 0;
 - bytes: all_reduce sent 20000 and received 20000; broadcast worker 1 sent 4000, worker 0
   received 4000;
 - the latency histogram of all_reduce: count 5, cumulative buckets, +Inf bucket 5, sum > 0;
 - peer failures 0; GET /healthz is "ok", another path 404.

With tests/ps_helper as <helper>, the parameter-server chief instead (run_coordinator_job): a
cluster of 1 ps and 2 workers (ps_helper processes) and a chief (ps_helper chief) whose
ClusterCoordinator schedules 40 closures of 50 ms; worker 1 is SIGKILLed when a quarter are done,
then restarted. The chief's /metrics, on 127.0.0.1:DISTRIBUTE_METRICS_PORT, must show: 40
scheduled and completed, 0 failed or cancelled, > 0 retried (what the chief says it retried), one
worker failure (reason connection_lost or no_heartbeat: whichever noticed it), one recovery, 40 fetches, a latency histogram of 40
with none under 50 ms, the queue empty and 2 workers up; every series labelled task_type="chief",
task_index="0", no job.
"""
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_safetensors_numpy import run_in_venv  # noqa: E402

REQUIREMENTS = ["prometheus_client==0.26.0"]
N, COUNT = 5, 1000


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def metrics_base():
    """Two consecutive free ports (worker i serves on base + i)."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise Failure("no two consecutive free ports")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def families(text):
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family, name, **labels):
    found = [s.value for s in fams[family].samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    check(len(found) == 1, f"{name}{labels}: {len(found)} samples")
    return found[0]


def check_worker(i, port):
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    check(status == 200, f"worker {i}: GET /metrics answered {status}")
    fams = families(text)
    for f in fams.values():
        for s in f.samples:
            check("job" not in s.labels, f"worker {i}: a sample labelled job: {s}")
            check(s.labels.get("task_type") == "worker" and s.labels.get("task_index") == str(i),
                  f"worker {i}: a sample without its task labels: {s}")
    # prometheus_client names a counter family without its _total suffix.
    check(value(fams, "distribute_collectives", "distribute_collectives_total", kind="all_reduce") == N,
          f"worker {i}: all_reduce count")
    check(value(fams, "distribute_collectives", "distribute_collectives_total", kind="broadcast") == 1,
          f"worker {i}: broadcast count")
    check(value(fams, "distribute_collectives_failed", "distribute_collectives_failed_total", kind="all_reduce") == 0,
          f"worker {i}: failed all-reduces")
    sent = "distribute_collective_bytes_sent"
    received = "distribute_collective_bytes_received"
    check(value(fams, sent, sent + "_total", kind="all_reduce") == N * COUNT * 4, f"worker {i}: all_reduce bytes sent")
    check(value(fams, received, received + "_total", kind="all_reduce") == N * COUNT * 4,
          f"worker {i}: all_reduce bytes received")
    check(value(fams, sent, sent + "_total", kind="broadcast") == (COUNT * 4 if i == 1 else 0), f"worker {i}: broadcast sent")
    check(value(fams, received, received + "_total", kind="broadcast") == (COUNT * 4 if i == 0 else 0),
          f"worker {i}: broadcast received")
    lat = "distribute_collective_latency_seconds"
    check(fams[lat].type == "histogram", f"worker {i}: {lat} is a {fams[lat].type}")
    buckets = [(float(s.labels["le"]), s.value) for s in fams[lat].samples
               if s.name == lat + "_bucket" and s.labels["kind"] == "all_reduce"]
    check(len(buckets) >= 2 and buckets[-1][0] == float("inf") and buckets[-1][1] == N, f"worker {i}: buckets {buckets}")
    check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), f"worker {i}: buckets not cumulative {buckets}")
    check(value(fams, lat, lat + "_count", kind="all_reduce") == N, f"worker {i}: latency count")
    check(value(fams, lat, lat + "_sum", kind="all_reduce") > 0, f"worker {i}: latency sum")
    for reason in ("peer_lost", "timeout", "mismatch", "config"):
        check(value(fams, "distribute_peer_failures", "distribute_peer_failures_total", reason=reason) == 0,
              f"worker {i}: peer failures ({reason})")
    check(get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n"), f"worker {i}: /healthz")
    check(get(f"http://127.0.0.1:{port}/nothing")[0] == 404, f"worker {i}: another path")


PS_CLOSURES = 40


def run_coordinator_job(helper, env_extra, at_done):
    """1 ps, 2 workers and a chief (ps_helper processes); worker 1 SIGKILLed and restarted mid-way.
    Calls at_done(metrics_port, chief_stats) while the chief waits after its closures, then lets
    it shut the cluster down. chief_stats: (counter, retried, workers_up) as the chief printed them."""
    ports = free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{ports[3]}"], "ps": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    spec = json.dumps(cluster)
    base_env = dict(os.environ)
    for k in ("DISTRIBUTE_METRICS_PORT", "DISTRIBUTE_TIMELINE"):
        base_env.pop(k, None)

    def task(job, index):
        return subprocess.Popen([helper, job, str(index), spec], env=base_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    servers = [task("ps", 0), task("worker", 0), task("worker", 1)]
    chief = None
    try:
        chief = subprocess.Popen([helper, "chief", str(PS_CLOSURES), spec], env=dict(base_env, **env_extra),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def expect(word):
            line = chief.stdout.readline()
            if not line.startswith(word):
                chief.kill()
                raise Failure(f"chief: expected '{word}', got {line!r} {chief.stdout.read()} {chief.stderr.read()}")
            return line.split()[1:]

        metrics_port = int(expect("ready")[0])
        expect("kill")
        servers[2].kill()
        servers[2].wait()
        servers[2] = task("worker", 1)
        counter, retried, up = expect("done")
        at_done(metrics_port, (float(counter), int(retried), int(up)))
        chief.stdin.write("done\n")
        chief.stdin.flush()
        rc = chief.wait(timeout=60)
        check(rc == 0, f"the chief exited {rc}: {chief.stderr.read()}")
        for p in servers:
            check(p.wait(timeout=30) == 0, "a ps or worker task did not stop when the chief shut the cluster down")
    finally:
        for p in servers + ([chief] if chief else []):
            if p.poll() is None:
                p.kill()
                p.wait()


def check_coordinator(helper):
    base = metrics_base()

    def at_done(port, stats):
        counter, retried, up = stats
        check(port == base, f"the chief serves on {port}, expected DISTRIBUTE_METRICS_PORT={base}")
        check(counter == PS_CLOSURES and up == 2, f"the chief saw counter {counter}, {up} workers up")
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        check(status == 200, f"chief: GET /metrics answered {status}")
        fams = families(text)
        for f in fams.values():
            for s in f.samples:
                check("job" not in s.labels, f"chief: a sample labelled job: {s}")
                check(s.labels.get("task_type") == "chief" and s.labels.get("task_index") == "0",
                      f"chief: a sample without its task labels: {s}")
        c = "distribute_coordinator_"

        def counter_value(name, **labels):
            return value(fams, c + name, c + name + "_total", **labels)

        check(counter_value("closures_scheduled") == PS_CLOSURES, "closures scheduled")
        check(counter_value("closures_completed") == PS_CLOSURES, "closures completed")
        check(counter_value("closures_failed") == 0 and counter_value("closures_cancelled") == 0, "closures failed")
        check(counter_value("closures_retried") == retried and retried > 0,
              f"closures retried: {counter_value('closures_retried')}, the chief says {retried} (> 0)")
        # One loss, noticed by a closure's call or by a heartbeat, whichever came first.
        lost = [counter_value("worker_failures", reason=r) for r in ("connection_lost", "no_heartbeat")]
        check(sum(lost) == 1, f"worker failures (connection_lost, no_heartbeat): {lost}")
        check(counter_value("worker_recoveries") == 1, "worker recoveries")
        check(counter_value("remote_value_fetches") == PS_CLOSURES, "remote value fetches")
        lat = c + "closure_latency_seconds"
        check(fams[lat].type == "histogram", f"chief: {lat} is a {fams[lat].type}")
        buckets = [(float(s.labels["le"]), s.value) for s in fams[lat].samples if s.name == lat + "_bucket"]
        check(buckets[-1] == (float("inf"), PS_CLOSURES), f"chief: latency buckets {buckets}")
        check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), f"chief: buckets not cumulative {buckets}")
        # Closures of 50 ms: none can take less, from schedule() to its result.
        check(value(fams, lat, lat + "_bucket", le="0.05") == 0, f"chief: a closure faster than its 50 ms {buckets}")
        check(value(fams, lat, lat + "_sum", ) >= PS_CLOSURES * 0.05, "chief: latency sum")
        check(value(fams, c + "queued_closures", c + "queued_closures") == 0, "queue length")
        check(value(fams, c + "workers_up", c + "workers_up") == 2, "workers up")
        check(get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n"), "chief: /healthz")

    try:
        run_coordinator_job(helper, {"DISTRIBUTE_METRICS_PORT": str(base)}, at_done)
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    print(f"ok: the parameter-server chief's /metrics parsed by prometheus_client: {PS_CLOSURES} closures scheduled, "
          "completed and fetched, retries, the SIGKILLed worker's failure and recovery, latency histogram, gauges, "
          "task_type=chief labels")
    return 0


def checks(helper):
    if os.path.basename(helper).startswith("ps_helper"):
        return check_coordinator(helper)
    ports = free_ports(2)
    base = metrics_base()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for i in range(2):
            env = dict(os.environ)
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            env["DISTRIBUTE_METRICS_PORT"] = str(base)
            env.pop("DISTRIBUTE_TIMELINE", None)
            procs.append(subprocess.Popen([helper, "metrics", str(N), str(COUNT)], env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        served = []
        for i, p in enumerate(procs):
            line = p.stdout.readline()  # the helper writes nothing else before it
            check(line.startswith("ready "), f"worker {i}: {line!r}{p.stdout.read() if p.poll() is not None else ''}")
            served.append(int(line.split()[1]))
        check(served == [base, base + 1], f"the workers serve on {served}, expected {base} and {base + 1}")
        for i, port in enumerate(served):
            check_worker(i, port)
        for p in procs:
            p.stdin.write("done\n")
            p.stdin.flush()
        for i, p in enumerate(procs):
            rc = p.wait(timeout=60)
            check(rc == 0, f"worker {i} exited {rc}: {p.stdout.read()}")
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(f"ok: /metrics of both workers parsed by prometheus_client: {N} all-reduces, 1 broadcast, bytes, "
          "latency histograms, task_type/task_index labels, no job label")
    return 0


if __name__ == "__main__":
    sys.exit(run_in_venv(__file__, __doc__, checks, REQUIREMENTS))
