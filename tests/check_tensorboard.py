#!/usr/bin/env python3
"""Event files against TensorBoard's own code (PyPI's `tensorboard`).

Usage: check_tensorboard.py <summary_helper>

The package is installed from PyPI into a virtual environment created once and reused (the driver
of check_safetensors_numpy.py: ~/.cache/distribute-venv/<key>); where it cannot be made (no network,
no wheel) the script prints why and exits 77, which meson reports as SKIP.

Inside the environment:
1. `summary_helper write DIR` writes scalars with ds::SummaryWriter (the formulas in
   tests/summary_helper.cpp); TensorBoard's EventAccumulator reads DIR and its Scalars(tag) must
   hold every value (as float32, NaN and infinities included) at its step, in order, with wall
   times that never go back and lie within the helper's run; the file's name has TF 2's form
   (events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>.v2) and the file version is 2.
2. TensorBoard's own EventFileWriter writes a file (scalars as simple_value, and a tensor value
   with scalars-plugin metadata); `summary_helper read FILE` (ds::summary::read_event_file) must
   give back every event: wall time, step, file version, simple values, and the tensor value's tag
   without a simple value.
"""
import math
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from check_safetensors_numpy import run_in_venv

# Pinned so that a run is reproducible; a new pin makes a new environment.
REQUIREMENTS = ["tensorboard==2.21.0", "numpy==2.4.6", "protobuf==7.36.2"]


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def f32(x):
    """x rounded to float32 as the event file's simple_value holds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def expected_scalars():
    big = 1 << 40
    return {
        "loss": [(s, f32(1.0 / (1.0 + s))) for s in range(0, 500, 10)],
        "accuracy": [(s, f32(s / 500.0)) for s in range(0, 500, 10)],
        "weird": [(3, math.nan), (4, math.inf), (5, -math.inf)],
        "big/step": [(big, -2.5), (big + 1, f32(1e30))],
    }


def check_tensorboard_reads_ours(helper, tmp):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = os.path.join(tmp, "ours")
    before = time.time()
    r = subprocess.run([helper, "write", logdir], capture_output=True, text=True, timeout=60)
    after = time.time()
    check(r.returncode == 0, f"summary_helper write: {r.stderr.strip()}")
    files = os.listdir(logdir)
    check(len(files) == 1, f"one event file expected in {logdir}: {files}")
    pattern = (r"events\.out\.tfevents\.(\d{10})\." + re.escape(socket.gethostname()) + r"\.(\d+)\.(\d+)\.v2")
    m = re.fullmatch(pattern, files[0])
    check(m is not None, f"file name {files[0]!r} is not TF 2's {pattern}")
    check(int(before) - 1 <= int(m.group(1)) <= after + 1, f"file name time {m.group(1)} outside [{before}, {after}]")

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    check(acc.file_version == 2.0, f"file version {acc.file_version}")
    want = expected_scalars()
    check(sorted(acc.Tags()["scalars"]) == sorted(want), f"scalar tags {acc.Tags()['scalars']}")
    for tag, points in want.items():
        got = acc.Scalars(tag)
        check([e.step for e in got] == [s for s, _ in points], f"{tag}: steps {[e.step for e in got]}")
        for e, (step, value) in zip(got, points):
            check(same(e.value, value), f"{tag} at step {step}: {e.value!r}, expected {value!r}")
            check(before - 1 <= e.wall_time <= after + 1, f"{tag} at step {step}: wall_time {e.wall_time} outside the run")
        walls = [e.wall_time for e in got]
        check(walls == sorted(walls), f"{tag}: wall times go back: {walls}")
    print(f"ok: TensorBoard {__import__('tensorboard').__version__}'s EventAccumulator reads ds::SummaryWriter's "
          f"file {files[0]}: {sum(len(p) for p in want.values())} scalars under {len(want)} tags, steps, values "
          "(NaN, inf included) and wall times")


def check_we_read_tensorboards(helper, tmp):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir = os.path.join(tmp, "theirs")
    writer = EventFileWriter(logdir)
    written = []  # (wall_time, step, [(tag, value or None)])
    for step in range(0, 30, 3):
        wall = 1.7e9 + step / 8
        values = [("loss", f32(2.0 / (step + 1))), ("lr", f32(0.1 * 0.5 ** step))]
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values])))
        written.append((wall, step, values))
    # A TF 2 style scalar: a float tensor with the scalars plugin's metadata, no simple_value.
    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tensor = TensorProto(dtype=1, float_val=[3.5])
    writer.add_event(event_pb2.Event(wall_time=1.7e9 + 10, step=-7, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="tensor_scalar", metadata=metadata, tensor=tensor)])))
    written.append((1.7e9 + 10, -7, [("tensor_scalar", None)]))
    writer.close()
    files = os.listdir(logdir)
    check(len(files) == 1, f"TensorBoard wrote {files}")
    r = subprocess.run([helper, "read", os.path.join(logdir, files[0])], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"summary_helper read: {r.stderr.strip()}")
    lines = r.stdout.splitlines()
    check(len(lines) == 1 + len(written), f"{len(lines)} events read, expected {1 + len(written)}:\n{r.stdout}")
    first = lines[0].split()
    check(first[2:] == ["version=brain.Event:2"], f"first event: {lines[0]}")
    for line, (wall, step, values) in zip(lines[1:], written):
        fields = line.split()
        check(abs(float(fields[0]) - wall) < 1e-6 and int(fields[1]) == step, f"{line}: expected time {wall} step {step}")
        got = [f.split("=", 1) for f in fields[2:]]
        check([t for t, _ in got] == [t for t, _ in values], f"{line}: tags, expected {values}")
        for (tag, text), (_, value) in zip(got, values):
            if value is None:
                check(text == "?", f"{line}: {tag} has no simple_value, read {text}")
            else:
                check(f32(float(text)) == value, f"{line}: {tag}={text}, expected {value!r}")
    print(f"ok: ds::summary::read_event_file reads TensorBoard's EventFileWriter file: {len(written)} events, "
          "simple values and a tensor-only value")


def checks(helper):
    with tempfile.TemporaryDirectory(prefix="distribute-tensorboard-") as tmp:
        try:
            check_tensorboard_reads_ours(helper, tmp)
            check_we_read_tensorboards(helper, tmp)
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
    return 0


def main():
    return run_in_venv(__file__, __doc__, checks, REQUIREMENTS)


if __name__ == "__main__":
    sys.exit(main())
