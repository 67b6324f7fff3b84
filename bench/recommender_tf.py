#!/usr/bin/env python3
"""The recommender on parameter servers against TensorFlow 2.21's ParameterServerStrategy, alternated in one run.

Both sides train the same model on the same files with the same hyperparameters: a user and an item embedding
table (U x D and I x D, uniform(-0.05, 0.05), each split in 2 shards over the 2 ps tasks), prediction
Dense(1)(user_row * item_row), the sum of squared errors over the batch (Keras's MeanSquaredError with reduction
"sum": a row's gradient is one example's size, which Adagrad's accumulator starting at 0.1 is scaled for; a batch
mean leaves the tables nearly still), Adagrad (initial accumulator 0.1, epsilon 1e-7),
one closure = one training step of one batch, N / B closures scheduled and joined, 2 ps tasks and 3 workers on
loopback with the coordinator in the driving process. Figures: examples/s over the steps after the warm-up, the
mean squared error on eval.bin after N training examples, and the bytes through the ps tasks per timed step.

Data (DIR/train.bin, DIR/eval.bin: 20-byte little-endian records int64 user, int64 item, float32 label;
DIR/meta.json) come from --data, from our binary's `--write-data` (the default), or, for developing this script
without our binary, from --fake-data (numpy, the same format, from a hidden model of the same form).

TF side: tf.distribute.Server processes for the ps tasks and workers and a ClusterCoordinator in a child process,
all from the venv ~/.cache/distribute-tf-venv ($DISTRIBUTE_TF_VENV; made here if missing, as scripts/conformance.sh
does) or --python. The model is written with Keras 2 (the `tf_keras` package, TF_USE_LEGACY_KERAS=1): Keras 3,
which TF 2.21 ships as tf.keras, looks rows up with `ops.take`, which converts the whole ShardedVariable to one
tensor on every step (both tables travel to the worker each step and the gradients come back dense); Keras 2's
Embedding calls tf.nn.embedding_lookup on the ShardedVariable, so each shard's ps gathers the rows, the gradients
stay tf.IndexedSlices (checked at trace time; the run fails otherwise) and Adagrad updates only those rows.
Each worker reads its own shard of train.bin: ParameterServerStrategy's InputContext says 1 input pipeline on
every worker, so the shard index is tf.distribute.coordinator.experimental_get_current_worker_index().
Bytes through the ps: bytes_acked + bytes_received of every TCP socket of the ps processes (`ss -tinpH`), before
and after the timed steps.

Ours: build/tools/distribute-launch --ps 2 --workers 3 -- build/examples/recommender (or --ours CMD) with
`--data DIR --batch B --lr LR --dim D --examples N --warmup-steps W --report-json` appended; it prints
`RESULT {json}`. Each round runs TF, then ours; the table gives each round's figures and ours / TF in that round.

  python3 bench/recommender_tf.py [--rounds 3] [--data DIR | --fake-data] [--users 1000000] [--items 1000000]
      [--dim 32] [--batch 256] [--lr 0.1] [--examples 2000000] [--warmup-steps 50] [--ours CMD] [--tf-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DISTRIBUTE_TF_VENV", Path.home() / ".cache" / "distribute-tf-venv"))
REQUIREMENTS = ["tensorflow==2.21.*", "tf_keras==2.21.*"]
RECORD_BYTES = 20
FIGURES = [("examples/s", "examples_per_s", "{:,.0f}"), ("eval loss (MSE)", "eval_loss", "{:.4f}"),
           ("bytes through the ps per step", "bytes_per_step", "{:,.0f}")]

TF_SERVER = r"""
import json, os, sys
import tensorflow as tf
cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
server = tf.distribute.Server(cluster, job_name=sys.argv[2], task_index=int(sys.argv[3]), protocol="grpc", start=True)
print("serving", flush=True)
server.join()
"""

FAKE_DATA = r"""
import json, sys
from pathlib import Path
import numpy as np
out, users, items, dim, train, evals, seed = sys.argv[1], *map(int, sys.argv[2:])
noise_std, bias = 0.1, 0.5
rng = np.random.default_rng(seed)
u = rng.standard_normal((users, dim), dtype=np.float32)
v = rng.standard_normal((items, dim), dtype=np.float32)
w = (rng.standard_normal(dim) / np.sqrt(dim)).astype(np.float32)  # keeps the label's variance near 1 for any D
record = np.dtype([("user", "<i8"), ("item", "<i8"), ("label", "<f4")])  # packed: 20 bytes

def write(path, count):
    squared_noise = 0.0
    with open(path, "wb") as f:
        for start in range(0, count, 1 << 18):
            n = min(1 << 18, count - start)
            chunk = np.empty(n, record)
            chunk["user"] = rng.integers(0, users, n)
            chunk["item"] = rng.integers(0, items, n)
            noise = (noise_std * rng.standard_normal(n)).astype(np.float32)
            chunk["label"] = (u[chunk["user"]] * v[chunk["item"]]) @ w + bias + noise
            squared_noise += float(np.sum(np.square(noise, dtype=np.float64)))
            chunk.tofile(f)
    return squared_noise / count

write(Path(out) / "train.bin", train)
truth = write(Path(out) / "eval.bin", evals)
meta = {"users": users, "items": items, "dim": dim, "train_examples": train, "eval_examples": evals,
        "noise_std": noise_std, "truth_eval_loss": truth}
(Path(out) / "meta.json").write_text(json.dumps(meta))
"""

TF_TRAINER = r"""
import json, re, subprocess, sys, time
import numpy as np
import tensorflow as tf
import tf_keras as keras

cfg = json.loads(sys.argv[1])
started = time.perf_counter()
meta = json.loads(open(cfg["data"] + "/meta.json").read())
batch, dim = cfg["batch"], meta["dim"]
steps = cfg["examples"] // batch
warmup = cfg["warmup_steps"]

def ps_bytes():
    # ss prints each socket on a line with its owner, then its TCP counters on an indented line.
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    total, owned = 0, False
    for line in out.splitlines():
        if not line[:1].isspace():
            owned = any(f"pid={pid}," in line for pid in cfg["ps_pids"])
        elif owned:
            total += sum(int(n) for n in re.findall(r"\bbytes_(?:acked|received):(\d+)", line))
    return total

resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(cfg["cluster"]), rpc_layer="grpc", task_type="chief", task_id=0)
strategy = tf.distribute.ParameterServerStrategy(
    resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
num_workers = len(cfg["cluster"]["worker"])

with strategy.scope():
    user_table = keras.layers.Embedding(meta["users"], dim)
    item_table = keras.layers.Embedding(meta["items"], dim)
    head = keras.layers.Dense(1)
    user_table.build((None,))
    item_table.build((None,))
    head.build((None, dim))
    variables = user_table.trainable_weights + item_table.trainable_weights + head.trainable_weights
    optimizer = keras.optimizers.Adagrad(cfg["lr"], initial_accumulator_value=0.1, epsilon=1e-7)
    optimizer.build(variables)  # slots on the ps now: a scheduled function may not create variables
embedding_variables = len(user_table.trainable_weights + item_table.trainable_weights)

def predict(users, items):
    return tf.squeeze(head(user_table(users) * item_table(items)), 1)

def decode(records):  # a batch of 20-byte strings -> (user, item, label); this host is little-endian
    raw = tf.io.decode_raw(records, tf.uint8)
    return (tf.bitcast(raw[:, 0:8], tf.int64), tf.bitcast(raw[:, 8:16], tf.int64),
            tf.bitcast(raw[:, 16:20], tf.float32))

def dataset_fn(input_context):  # under ParameterServerStrategy it says 1 pipeline, id 0, on every worker
    dataset = tf.data.FixedLengthRecordDataset(cfg["data"] + "/train.bin", 20)
    dataset = dataset.shard(num_workers, tf.distribute.coordinator.experimental_get_current_worker_index())
    return dataset.batch(batch, drop_remainder=True).map(decode).repeat().prefetch(tf.data.AUTOTUNE)

@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
gradient_kinds = []  # filled while tracing

@tf.function
def train_step(iterator):
    def replica_fn(batch):
        users, items, labels = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(predict(users, items) - labels))
        gradients = tape.gradient(loss, variables)
        gradient_kinds[:] = [type(g).__name__ for g in gradients[:embedding_variables]]
        optimizer.apply_gradients(zip(gradients, variables))
        return loss
    return strategy.run(replica_fn, args=(next(iterator),))

setup_s = time.perf_counter() - started
started = time.perf_counter()
for _ in range(warmup):
    coordinator.schedule(train_step, args=(iterator,))
coordinator.join()
warmup_s = time.perf_counter() - started

bytes_before = ps_bytes()
started = time.perf_counter()
for _ in range(steps - warmup):
    coordinator.schedule(train_step, args=(iterator,))
coordinator.join()
seconds = time.perf_counter() - started
bytes_after = ps_bytes()
if any(kind != "IndexedSlices" for kind in gradient_kinds):
    sys.exit(f"TF: the embedding gradients are {gradient_kinds}, not IndexedSlices")

@tf.function
def squared_error(users, items, labels):
    return tf.reduce_sum(tf.square(predict(users, items) - labels))

record = np.dtype([("user", "<i8"), ("item", "<i8"), ("label", "<f4")])
evals = np.fromfile(cfg["data"] + "/eval.bin", record)
total = 0.0
for start in range(0, len(evals), 1 << 16):
    chunk = evals[start:start + (1 << 16)]
    total += float(squared_error(chunk["user"], chunk["item"], chunk["label"]))

timed = steps - warmup
print(json.dumps({"examples": timed * batch, "seconds": seconds, "examples_per_s": timed * batch / seconds,
                  "eval_loss": total / len(evals), "bytes_per_step": (bytes_after - bytes_before) / timed,
                  "truth_eval_loss": meta["truth_eval_loss"], "setup_s": setup_s, "warmup_s": warmup_s,
                  "gradient_kinds": gradient_kinds}))
"""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ensure_venv(python: str) -> None:
    """Makes the default venv with TF and tf_keras when it lacks them (another --python is taken as it is)."""
    if Path(python) != VENV / "bin" / "python":
        return
    if not Path(python).exists():
        print(f"creating {VENV} with {' '.join(REQUIREMENTS)} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if subprocess.run([python, "-c", "import tensorflow, tf_keras"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)


def tf_env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1", TF_USE_LEGACY_KERAS="1")


def check_data(data: Path) -> dict:
    if not (data / "meta.json").is_file():
        sys.exit(f"{data}: no meta.json (a data directory holds train.bin, eval.bin and meta.json)")
    meta = json.loads((data / "meta.json").read_text())
    for name, key in [("train.bin", "train_examples"), ("eval.bin", "eval_examples")]:
        size = (data / name).stat().st_size
        if size != meta[key] * RECORD_BYTES:
            sys.exit(f"{data / name}: {size} bytes, but meta.json says {meta[key]} records of {RECORD_BYTES} bytes")
    return meta


def run_tf(python: str, data: Path, args: argparse.Namespace) -> dict:
    ports = free_ports(6)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"chief": [addr[5]], "ps": addr[0:2], "worker": addr[2:5]}
    env = tf_env()
    servers = []
    try:
        launched = time.perf_counter()
        for job, index in [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2)]:
            servers.append(subprocess.Popen([python, "-c", TF_SERVER, json.dumps(cluster), job, str(index)], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for s in servers:
            if s.stdout.readline().strip() != "serving":
                sys.exit("a TF server did not start")
        servers_s = time.perf_counter() - launched
        cfg = {"cluster": cluster, "data": str(data), "batch": args.batch, "lr": args.lr, "examples": args.examples,
               "warmup_steps": args.warmup_steps, "ps_pids": [s.pid for s in servers[:2]]}
        result = subprocess.run([python, "-c", TF_TRAINER, json.dumps(cfg)], env=env, capture_output=True, text=True,
                                timeout=3600)
        if result.returncode != 0:
            sys.exit(f"TF coordinator failed:\n{result.stderr[-4000:]}")
        return dict(json.loads(result.stdout.strip().splitlines()[-1]), servers_s=servers_s)
    finally:
        for s in servers:
            s.kill()
            s.wait()


def run_ours(command: list[str], data: Path, meta: dict, args: argparse.Namespace) -> dict:
    flags = ["--data", str(data), "--batch", str(args.batch), "--lr", str(args.lr), "--dim", str(meta["dim"]),
             "--init-scale", "0.05",  # Keras's Embedding initializer: uniform(-0.05, 0.05)
             "--examples", str(args.examples), "--warmup-steps", str(args.warmup_steps), "--report-json"]
    result = subprocess.run(command + flags, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    # The launcher prefixes the chief's lines with "[chief:0] ".
    lines = [line[line.index("RESULT "):] for line in result.stdout.splitlines() if "RESULT {" in line]
    if result.returncode != 0 or not lines:
        sys.exit(f"ours failed ({shlex.join(command + flags)}, exit {result.returncode}):\n"
                 f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def require(path: Path, what: str) -> None:
    if not path.exists():
        sys.exit(f"{path} does not exist: {what} needs our recommender example built "
                 "(or run the TF side alone: --tf-only with --data DIR or --fake-data)")


def write_data(args: argparse.Namespace, python: str, out: Path) -> None:
    sizes = [args.users, args.items, args.dim, args.examples, args.eval_examples, args.seed]
    if args.fake_data:
        subprocess.run([python, "-c", FAKE_DATA, str(out), *map(str, sizes)], check=True)
        return
    require(Path(args.recommender), "writing the data")
    subprocess.run([args.recommender, "--write-data", str(out), "--users", str(args.users), "--items", str(args.items),
                    "--dim", str(args.dim), "--examples", str(args.examples), "--eval-examples",
                    str(args.eval_examples), "--seed", str(args.seed)], cwd=ROOT, check=True)


def print_table(rows: dict[str, dict[str, list[float]]]) -> None:
    print("| figure | ours (per round) | TF (per round) | ours / TF per round | median |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, key, fmt in FIGURES:
        o, t = rows[key]["ours"], rows[key]["tf"]
        tf_cells = " / ".join(fmt.format(x) for x in t)
        if o:
            ratios = [a / b for a, b in zip(o, t)]
            print(f"| {name} | {' / '.join(fmt.format(x) for x in o)} | {tf_cells} | "
                  f"{' / '.join(f'{x:.2f}x' for x in ratios)} | **{statistics.median(ratios):.2f}x** |")
        else:
            print(f"| {name} | — | {tf_cells} | — | {fmt.format(statistics.median(t))} (TF) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", type=Path, help="a directory with train.bin, eval.bin and meta.json")
    source.add_argument("--fake-data", action="store_true", help="numpy-generated data, for developing this script")
    parser.add_argument("--users", type=int, default=1_000_000, help="rows of the user table (data written here)")
    parser.add_argument("--items", type=int, default=1_000_000, help="rows of the item table (data written here)")
    parser.add_argument("--dim", type=int, default=32, help="embedding width (data written here)")
    parser.add_argument("--examples", type=int, default=2_000_000, help="training examples (steps: examples / batch)")
    parser.add_argument("--eval-examples", type=int, default=100_000, help="held-out examples (data written here)")
    parser.add_argument("--seed", type=int, default=1, help="of the data written here")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=50, help="steps before the timed ones, in both sides")
    parser.add_argument("--recommender", default=str(ROOT / "build" / "examples" / "recommender"))
    parser.add_argument("--ours", help="the command that runs ours, in the repository root, before the flags appended "
                        "(default: build/tools/distribute-launch --ps 2 --workers 3 -- RECOMMENDER)")
    parser.add_argument("--tf-only", action="store_true", help="run TensorFlow's side alone")
    parser.add_argument("--python", default=str(VENV / "bin" / "python"), help="a python with tensorflow, tf_keras")
    args = parser.parse_args()
    if args.examples // args.batch <= args.warmup_steps:
        sys.exit(f"--examples {args.examples} gives {args.examples // args.batch} steps of {args.batch}: "
                 f"not more than the {args.warmup_steps} warm-up steps")

    if args.ours:
        ours_command = shlex.split(args.ours)
    else:
        launcher = ROOT / "build" / "tools" / "distribute-launch"
        ours_command = [str(launcher), "--ps", "2", "--workers", "3", "--", args.recommender]
        if not args.tf_only:
            require(launcher, "running ours")
            require(Path(args.recommender), "running ours")
    ensure_venv(args.python)

    scratch = None if args.data else Path(tempfile.mkdtemp(prefix="recommender-data-"))
    try:
        data = args.data or scratch
        if scratch:
            started = time.perf_counter()
            write_data(args, args.python, scratch)
            print(f"data written to {scratch} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        meta = check_data(data)
        print(f"data: {meta['users']:,} users x {meta['items']:,} items x {meta['dim']}, {meta['train_examples']:,} "
              f"train / {meta['eval_examples']:,} eval records; training on {args.examples:,} examples in "
              f"batches of {args.batch}", file=sys.stderr)
        rows = {key: {"ours": [], "tf": []} for _, key, _ in FIGURES}
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            tf = run_tf(args.python, data, args)
            line = (f"round {r + 1} (load {load:.1f}): TF {tf['examples_per_s']:,.0f} examples/s, eval loss "
                    f"{tf['eval_loss']:.4f} (truth {tf['truth_eval_loss']:.4f}), {tf['bytes_per_step']:,.0f} B/step "
                    f"through the ps; TF's start: servers {tf['servers_s']:.1f} s, coordinator and model "
                    f"{tf['setup_s']:.1f} s, {args.warmup_steps} warm-up "
                    f"steps {tf['warmup_s']:.1f} s")
            for key in rows:
                rows[key]["tf"].append(tf[key])
            if not args.tf_only:
                ours = run_ours(ours_command, data, meta, args)
                line += (f"; ours {ours['examples_per_s']:,.0f} examples/s, eval loss {ours['eval_loss']:.4f}, "
                         f"{ours['bytes_per_step']:,.0f} B/step, {ours['examples_per_s'] / tf['examples_per_s']:.2f}x")
                for key in rows:
                    rows[key]["ours"].append(ours[key])
            print(line, file=sys.stderr, flush=True)
        print_table(rows)
        print(f"\nTruth eval loss (the hidden model's noise on eval.bin): {meta['truth_eval_loss']:.4f}")
        return 0
    finally:
        if scratch:
            shutil.rmtree(scratch)


if __name__ == "__main__":
    sys.exit(main())
