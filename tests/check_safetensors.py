#!/usr/bin/env python3
"""Interop check: files written by distribute are valid safetensors, and distribute reads
safetensors files written by someone else.

Usage: check_safetensors.py <checkpoint_helper>

1. The helper writes files (every dtype, ranks 0-4; a ds::Checkpoint). This script parses them
   with its own reader (standard library only: struct + json + zlib), checks the layout rules of
   the format and of distribute (8-byte aligned header padded with spaces, contiguous offsets,
   aligned tensors, CRC-32s equal to zlib.crc32, the header digest), and compares every value with
   the formulas documented in checkpoint_helper.cpp.
2. This script writes a file by hand (unpadded header, unaligned tensors, no checksums) and the
   helper must read back exactly its values.
The check against the reference implementation (Python's safetensors with numpy and ml_dtypes),
which needs packages from PyPI, is check_safetensors_numpy.py.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zlib

DTYPES = {  # name: (size, struct code); F16/BF16 as raw bit patterns
    "F16": (2, "H"), "BF16": (2, "H"), "F32": (4, "f"), "F64": (8, "d"),
    "I8": (1, "b"), "I16": (2, "h"), "I32": (4, "i"), "I64": (8, "q"),
    "U8": (1, "B"), "U16": (2, "H"), "U32": (4, "I"), "U64": (8, "Q"), "BOOL": (1, "?"),
}
SHAPES = [[], [3], [2, 3], [2, 1, 4], [1, 2, 2, 3]]
# ckpt-1's 16-bit float variables (checkpoint_helper.cpp): the floats they were made from, and the
# bits those round to (to nearest even).
F16_VALUES = [1.0, -0.0, math.inf, -math.inf, math.nan, 2**-24, 1023 * 2**-24, 65504.0, -2.0, 0.1]
F16_BITS = [0x3C00, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF, 0xC000, 0x2E66]
BF16_VALUES = [1.0, -0.0, math.inf, -math.inf, math.nan, 2**-133, float.fromhex("0x1.fep127"), -2.0, 0.1,
               3.14159265]
BF16_BITS = [0x3F80, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x7F7F, 0xC000, 0x3DCD, 0x4049]


def expected(dtype, i):
    return {
        "F32": lambda: (i - 5) * 0.25, "F64": lambda: (i - 5) * 0.25,
        "I8": lambda: (i * 37) % 256 - 128, "U8": lambda: (i * 37) % 256,
        "I16": lambda: (i * 1001) % 65536 - 32768, "U16": lambda: (i * 1001) % 65536,
        "I32": lambda: i * 100003 - 2**31 + 5, "U32": lambda: 2**32 - 1 - i * 100003,
        "I64": lambda: i * 1234567890123 - 2**62, "U64": lambda: 2**64 - 1 - i * 1234567890123,
        "BOOL": lambda: i % 3 == 0,
        "F16": lambda: (0x3C00 + i * 0x111) % 65536, "BF16": lambda: (0x3F80 + i * 0x101) % 65536,
    }[dtype]()


def prod(shape):
    return math.prod(shape) if shape else 1


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def parse(path, distribute_written):
    """An independent reader following the safetensors specification."""
    with open(path, "rb") as f:
        data = f.read()
    check(len(data) >= 8, f"{path}: shorter than the length prefix")
    (n,) = struct.unpack("<Q", data[:8])
    check(8 + n <= len(data), f"{path}: header length {n} past the end")
    raw_header = data[8:8 + n]
    check(raw_header[:1] == b"{", f"{path}: header does not start with '{{'")
    header = json.loads(raw_header.decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    check(all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()),
          f"{path}: metadata must map strings to strings")
    payload = data[8 + n:]
    cursor = 0
    tensors = {}
    for name, entry in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        check(set(entry) == {"dtype", "shape", "data_offsets"}, f"{name}: fields {sorted(entry)}")
        size, code = DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = prod(entry["shape"])
        check(begin == cursor, f"{name}: begins at {begin}, expected {cursor}")
        check(end - begin == count * size, f"{name}: {end - begin} bytes for {count} x {size}")
        raw = payload[begin:end]
        tensors[name] = {
            "dtype": entry["dtype"], "shape": entry["shape"], "raw": raw, "offsets": (begin, end),
            "values": list(struct.unpack(f"<{count}{code}", raw)),
        }
        cursor = end
    check(cursor == len(payload), f"{path}: tensors cover {cursor} of {len(payload)} payload bytes")

    if distribute_written:
        check(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
        stripped = raw_header.rstrip(b" ")
        check(stripped.endswith(b"}"), f"{path}: the header padding is not spaces")
        for name, t in tensors.items():
            size = DTYPES[t["dtype"]][0]
            check((8 + n + t["offsets"][0]) % size == 0, f"{name}: not aligned to its element size")
            crc = metadata[f"distribute.crc32.{name}"]
            check(crc == f"{zlib.crc32(t['raw']):08x}", f"{name}: crc32 {crc} != zlib's")
        # The header digest, as documented in safetensors.hpp.
        text = b""
        for name in sorted(tensors):
            t = tensors[name]
            text += (b"T" + name.encode() + b"\0" + t["dtype"].encode() + b"\0"
                     + ",".join(str(d) for d in t["shape"]).encode() + b"\0"
                     + str(t["offsets"][0]).encode() + b"\0" + str(t["offsets"][1]).encode() + b"\n")
        for key in sorted(metadata):
            if key != "distribute.header_crc32":
                text += b"M" + key.encode() + b"\0" + metadata[key].encode() + b"\n"
        check(metadata["distribute.header_crc32"] == f"{zlib.crc32(text):08x}", f"{path}: header digest differs")
    return tensors, metadata


def run_helper(helper, *args):
    r = subprocess.run([helper, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure(f"{helper} {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def check_written_by_distribute(helper, tmp):
    run_helper(helper, "write", tmp)
    tensors, metadata = parse(os.path.join(tmp, "tensors.safetensors"), True)
    check(metadata.get("format") == "pt", "user metadata lost")
    check(len(tensors) == len(DTYPES) * len(SHAPES), f"{len(tensors)} tensors")
    for dtype in DTYPES:
        for rank, shape in enumerate(SHAPES):
            t = tensors[f"{dtype}_r{rank}"]
            check(t["dtype"] == dtype and t["shape"] == shape, f"{dtype}_r{rank}: {t['dtype']} {t['shape']}")
            want = [expected(dtype, i) for i in range(prod(shape))]
            check(t["values"] == want, f"{dtype}_r{rank}: {t['values']} != {want}")

    tensors, metadata = parse(os.path.join(tmp, "ckpt-1.safetensors"), True)
    check(metadata["distribute.save_counter"] == "1", "save counter")
    check(tensors["dense/kernel"]["shape"] == [3, 2], "kernel shape")
    check(tensors["dense/kernel"]["values"] == [expected("F32", i) for i in range(6)], "kernel values")
    check(tensors["step"]["shape"] == [] and tensors["step"]["values"] == [42], "step")
    check(tensors["embedding"]["shape"] == [5, 2], "the two shards are saved as one (5, 2) tensor")
    check(tensors["embedding"]["values"] == [expected("F64", i) for i in range(10)], "embedding values")
    for name, dtype, shape, bits in [("half/f16", "F16", [2, 5], F16_BITS), ("half/bf16", "BF16", [10], BF16_BITS),
                                     ("half/f16_scalar", "F16", [], [0xBE00]),
                                     ("half/bf16_scalar", "BF16", [], [0x3F00])]:
        t = tensors[name]
        check(t["dtype"] == dtype and t["shape"] == shape, f"{name}: {t['dtype']} {t['shape']}")
        check(t["values"] == bits, f"{name}: bits {[hex(b) for b in t['values']]} != {[hex(b) for b in bits]}")
    print("ok: files written by distribute parse with an independent reader, values and CRCs match")


def write_by_hand(path):
    """A file as another writer might produce it: no padding, no alignment, no checksums."""
    items = [  # (name, dtype, shape, values), in payload order
        ("py/u8", "U8", [], [255]),
        ("py/f32", "F32", [2, 2], [1.5, -2.0, 3.25, 0.0]),
        ("py/i64", "I64", [3], [-(2**63), 0, 2**63 - 1]),
        ("py/bool", "BOOL", [4], [True, False, False, True]),
        ("py/f16", "F16", [2], [0x3C00, 0xC000]),
        ("py/empty", "F32", [0, 3], []),
    ]
    header, payload = {"__metadata__": {"format": "np"}}, b""
    for name, dtype, shape, values in items:
        raw = struct.pack(f"<{len(values)}{DTYPES[dtype][1]}", *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(payload), len(payload) + len(raw)]}
        payload += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)
    return items


def check_read_by_distribute(helper, tmp):
    path = os.path.join(tmp, "by_python.safetensors")
    items = write_by_hand(path)
    lines = run_helper(helper, "dump", path).splitlines()
    got = {}
    for line in lines:
        if line.startswith("@"):
            continue
        name, dtype, dims, values = line.split("|")
        got[name] = (dtype, [int(d) for d in dims.split(",") if d], values)
    check(set(got) == {i[0] for i in items}, f"tensors read: {sorted(got)}")
    for name, dtype, shape, values in items:
        gdtype, gshape, gvalues = got[name]
        check(gdtype == dtype and gshape == shape, f"{name}: {gdtype} {gshape}")
        parse_value = float if dtype.startswith("F") and dtype != "F16" else int
        parsed = [parse_value(v) for v in gvalues.split(",")] if gvalues else []
        check(parsed == [int(v) if isinstance(v, bool) else v for v in values], f"{name}: {parsed} != {values}")
    check("@format=np" in lines, "metadata not read")
    print("ok: a file written by hand in Python reads back in distribute")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    helper = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="distribute-interop-") as tmp:
        try:
            check_written_by_distribute(helper, tmp)
            check_read_by_distribute(helper, tmp)
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
