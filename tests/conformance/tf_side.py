"""The TensorFlow side of the conformance suite: case generators (randomised from a seed) and the
same cases run through TensorFlow 2.21. Each area has gen(rng, count) -> [input] and
tf(input) -> value (JSON-able, the form case_runner.cpp writes) or raises when TF refuses the case.
Imported by driver.py inside the TensorFlow venv."""
import json
import math
import os

import numpy as np
import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 4)
_strategies = {}


def strategy(n):
    if n not in _strategies:
        _strategies[n] = tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(n)])
    return _strategies[n]


# ---- device strings ---------------------------------------------------------------------------

_KEYS = ["job", "replica", "task", "device", "cpu", "gpu", "CPU", "GPU", "Gpu", "tpu", "TPU", "custom", "epu",
         "EPU", "foo", "JOB", "Task", "DEVICE", "", "xla_cpu"]
_VALS = ["0", "1", "12", "-1", "+2", " 3", "1_0", "1__0", "_1", "x", "*", "", "worker", "a b", "007", "2147483648",
         "-2147483648", "CPU", "cpu", "gpu", "Cpu", "foo", "3 ", "\t4", "0x1", "1.0"]


def device_gen(rng, count):
    out = []
    for _ in range(count):
        comps = []
        for _ in range(rng.randint(0, 4)):
            nf = rng.choice([1, 2, 2, 2, 3, 3, 4])
            comps.append(":".join([rng.choice(_KEYS)] + [rng.choice(_VALS) for _ in range(nf - 1)]))
        out.append(("/" if rng.random() < 0.7 else "") + "/".join(comps))
    return out


def device_tf(s):
    d = tf.DeviceSpec.from_string(s)
    return {"job": d.job, "replica": d.replica, "task": d.task, "device_type": d.device_type,
            "device_index": d.device_index, "string": d.to_string()}


# ---- TF_CONFIG ----------------------------------------------------------------------------------

def _address(rng):
    host = rng.choice(["a", "b", "host0", "10.0.0.1", "[::1]", "localhost", "", "w-1.example"])
    port = rng.choice(["2222", "1", "65535", "0", "70000", "x", ""])
    return rng.choice([host + ":" + port] * 8 + [host, "grpc://a:1", 7, None])


def _job(rng):
    n = rng.choice([0, 1, 1, 2, 3])
    if rng.random() < 0.8:
        return [_address(rng) for _ in range(n)]
    return {str(rng.choice([0, 1, 2, 5, "a", -1][:5 if rng.random() < 0.9 else 6])): _address(rng) for _ in range(n)}


def tf_config_gen(rng, count):
    out = []
    names = ["chief", "worker", "ps", "evaluator"]
    for _ in range(count):
        cfg = {}
        r = rng.random()
        if r < 0.8:
            cfg["cluster"] = {j: _job(rng) for j in rng.sample(names + ["master"] * (rng.random() < 0.1),
                                                               rng.randint(0, 3))}
        elif r < 0.85:
            cfg["cluster"] = None
        if rng.random() < 0.85:
            task = {}
            if rng.random() < 0.95:
                task["type"] = rng.choice(names * 4 + ["master", None, 1])
            if rng.random() < 0.95:
                task["index"] = rng.choice([0, 0, 1, 1, 2, 3, -1, "1", "x", 1.5, True, None, 1000000])
            cfg["task"] = task if rng.random() < 0.97 else None
        if rng.random() < 0.3:
            cfg["rpc_layer"] = rng.choice(["grpc", "", None, "grpc+verbs"])
        if rng.random() < 0.05:
            cfg["session_master"] = rng.choice(["s:1", "grpc://s:2"])
        out.append(json.dumps(cfg))
    return out


def tf_config_tf(text):
    os.environ["TF_CONFIG"] = text
    try:
        r = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        spec = r.cluster_spec()
        cluster = {}
        for job in spec.jobs:
            cluster[job] = {str(i): spec.task_address(job, i) for i in spec.task_indices(job)}
        out = {"cluster": cluster, "task_type": r.task_type, "task_id": r.task_id,
               "rpc_layer": r.rpc_layer or "", "master": r.master()}
    finally:
        del os.environ["TF_CONFIG"]
    if out["task_type"] is None:  # local mode: ours reports worker 0
        out["task_type"], out["task_id"] = "worker", 0 if out["task_id"] is None else out["task_id"]
    if out["task_id"] is None:
        out["task_id"] = 0
    return out


# ---- partitioners --------------------------------------------------------------------------------

_P = tf.distribute.experimental.partitioners


def partitioner_gen(rng, count):
    out = []
    for _ in range(count):
        kind = rng.choice(["fixed", "min", "max"])
        shape = [rng.choice([0, 1, 2, 3, 5, 8, 100, 1000, 4096]) for _ in range(rng.randint(1, 3))]
        dtype = rng.choice(["float32", "float64", "int32", "int64", "int8", "float16"])
        if kind == "fixed":
            args = [rng.choice([1, 2, 3, 4, 7, 16, 1000])]
        elif kind == "min":
            args = [rng.choice([1, 4, 64, 1024, 256 << 10]), rng.choice([1, 2, 3, 8, 100]), 16]
        else:
            args = [rng.choice([1, 4, 63, 64, 1024, 4096, 1 << 20]), rng.choice([0, 1, 2, 5, 100]), 16]
        out.append({"kind": kind, "args": args, "shape": shape, "dtype": dtype})
    return out


def partitioner_tf(c, make_only=False):
    cls = {"fixed": _P.FixedShardsPartitioner, "min": _P.MinSizePartitioner, "max": _P.MaxSizePartitioner}[c["kind"]]
    if c["kind"] == "max" and c["args"][1] == 0:
        p = cls(c["args"][0], None, c["args"][2])  # TF's "no limit" is None; ours is 0
    else:
        p = cls(*c["args"])
    if make_only:
        return p
    return [int(x) for x in p(tf.TensorShape(c["shape"]), tf.as_dtype(c["dtype"]))]


# ---- values: reduce, gather, local_results, all_reduce, all_gather -------------------------------

def _tensor_json(t):
    a = np.asarray(t)
    vals = []
    for x in a.reshape(-1).tolist():
        if isinstance(x, float) and not math.isfinite(x):
            vals.append("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
        else:
            vals.append(x)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "values": vals}


def values_gen(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(1, 4)
        rank = rng.randint(0, 3)
        shape = [rng.randint(1, 4) for _ in range(rank)]
        dtype = rng.choice(["float32", "float64", "int32", "int64"])
        what = rng.choice(["reduce"] * 5 + ["gather", "gather", "local_results", "all_reduce", "all_gather",
                                            "from_function"])
        axis = None
        uneven = None  # the axis along which components may differ in size
        if what == "reduce":
            choice = rng.random()
            if rank and choice < 0.45:
                axis = rng.randint(-rank, rank - 1)
                uneven = axis % rank if rng.random() < 0.5 else None
            elif rank and choice < 0.7:
                axis = rng.sample(range(-rank, rank), rng.randint(0, rank))
                axis = [a for i, a in enumerate(axis) if all((a - b) % rank for b in axis[:i])]
                uneven = axis[0] % rank if axis and rng.random() < 0.5 else None
        elif what in ("gather", "all_gather"):
            if rank == 0:
                shape, rank = [2], 1
            # A negative axis only with one replica: with several, TF 2.21's collective fails and
            # poisons every later collective of the process ("Restart your program to reset"),
            # so those cases are tests in test_mirrored.cpp instead (docs/semantics.md).
            axis = rng.randint(0, rank - 1) if n > 1 or rng.random() < 0.5 else rng.randint(-rank, -1)
            uneven = axis % rank if rng.random() < 0.5 else None
        sizes = [rng.randint(0, 3) for _ in range(n)]
        if what in ("gather", "all_gather") and not any(sizes):
            sizes[rng.randrange(n)] = 1  # TF 2.21 crashes (SIGSEGV) gathering only empty tensors
        components = []
        for r in range(n):
            s = list(shape)
            if uneven is not None:
                s[uneven] = sizes[r]
            size = int(np.prod(s)) if s else 1
            if dtype.startswith("float"):
                vals = [round(rng.uniform(-100, 100), 3) for _ in range(size)]
            else:
                vals = [rng.randint(-1000, 1000) for _ in range(size)]
            components.append({"shape": s, "values": vals})
        op = rng.choice(["SUM", "MEAN", "sum", "Mean"])
        out.append({"replicas": n, "dtype": dtype, "what": what, "op": op, "axis": axis, "components": components})
    return out


def values_tf(c):
    s = strategy(c["replicas"])
    dtype = tf.as_dtype(c["dtype"])
    comps = [tf.constant(np.array(x["values"], dtype=dtype.as_numpy_dtype).reshape(x["shape"]))
             for x in c["components"]]
    v = s.experimental_distribute_values_from_function(lambda ctx: comps[ctx.replica_id_in_sync_group])
    what, axis, op = c["what"], c["axis"], c["op"].upper()
    if what == "reduce":
        return _tensor_json(s.reduce(op, v, axis=tuple(axis) if isinstance(axis, list) else axis))
    if what == "gather":
        return _tensor_json(s.gather(v, axis=axis))
    if what == "local_results":
        return [_tensor_json(t) for t in s.experimental_local_results(v)]
    if what == "from_function":
        seen = s.experimental_distribute_values_from_function(
            lambda ctx: (tf.constant([ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync], tf.int32),
                         comps[ctx.replica_id_in_sync_group]))
        ids, vals = (s.experimental_local_results(x) for x in seen)
        return [[_tensor_json(i), _tensor_json(x)] for i, x in zip(ids, vals)]
    if what == "all_reduce":
        res = s.run(lambda x: tf.distribute.get_replica_context().all_reduce(op, x), args=(v,))
    else:
        res = s.run(lambda x: tf.distribute.get_replica_context().all_gather(x, axis=axis), args=(v,))
    return [_tensor_json(t) for t in s.experimental_local_results(res)]


# ---- datasets ------------------------------------------------------------------------------------

def dataset_gen(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(1, 4)
        how = rng.choice(["distribute_dataset", "from_function"])
        batch = rng.randint(1, 5) * (n if how == "distribute_dataset" and rng.random() < 0.5 else 1)
        out.append({"replicas": n, "how": how, "n": rng.randint(0, 25), "batch": batch,
                    "drop_remainder": rng.random() < 0.5})
    return out


def dataset_tf(c):
    s = strategy(c["replicas"])

    def make(_ctx=None):
        return tf.data.Dataset.range(c["n"]).batch(c["batch"], drop_remainder=c["drop_remainder"])

    if c["how"] == "from_function":
        d = s.distribute_datasets_from_function(make)
    else:
        d = s.experimental_distribute_dataset(make())
    return [[t.numpy().tolist() for t in s.experimental_local_results(step)] for step in d]


# ---- sharded variables (ParameterServerStrategy on an in-process cluster) -----------------------

_ps = {}


def ps_strategy(num_ps):
    """One in-process cluster (1 worker, num_ps ps) and strategy per process: driver.py runs each
    num_ps in its own process, and the cases in order, since placement is round-robin across them."""
    if num_ps not in _ps:
        import socket

        def free_port():
            with socket.socket() as s:
                s.bind(("localhost", 0))
                return s.getsockname()[1]
        spec = {"worker": ["localhost:%d" % free_port()], "ps": ["localhost:%d" % free_port() for _ in range(num_ps)]}
        cs = tf.train.ClusterSpec(spec)
        servers = [tf.distribute.Server(cs, job_name=j, task_index=i, protocol="grpc", start=True)
                   for j in spec for i in range(len(spec[j]))]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cs, rpc_layer="grpc")
        _ps[num_ps] = (tf.distribute.experimental.ParameterServerStrategy(resolver), servers)
    return _ps[num_ps][0]


def sharded_gen(rng, count):
    out = []
    for p in partitioner_gen(rng, count):
        shape = [rng.choice([1, 2, 3, 4, 5, 7, 10, 13, 64, 100]) for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))]
        out.append({"num_ps": rng.choice([2, 3]), "partitioner": {"kind": p["kind"], "args": p["args"]},
                    "shape": shape, "dtype": rng.choice(["float32", "float64", "int32"])})
    return out


def sharded_tf(c):
    s = ps_strategy(c["num_ps"])
    p = c["partitioner"]
    # The partitioner is a constructor argument; one strategy per process serves every case (a
    # new strategy per case costs a second), so the case sets it on the strategy's extended.
    s.extended._variable_partitioner = partitioner_tf({**p, "shape": None, "dtype": None}, make_only=True)
    with s.scope():
        v = tf.Variable(tf.zeros(c["shape"], tf.as_dtype(c["dtype"])))
    parts = getattr(v, "variables", [v])
    return {"shapes": [list(x.shape) for x in parts], "devices": [x.device for x in parts]}


# ---- safetensors: files written by Python read by us, and the other way ---------------------------

_ST_DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def safetensors_gen(rng, count, directory):
    out = []
    for i in range(count):
        tensors = {}
        for k in range(rng.randint(0, 4)):
            dtype = rng.choice(_ST_DTYPES)
            shape = [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
            size = int(np.prod(shape)) if shape else 1
            if dtype == "bool":
                values = [rng.random() < 0.5 for _ in range(size)]
            elif dtype.startswith("float"):
                values = [rng.choice([round(rng.uniform(-1e3, 1e3), rng.randint(0, 6)), 0.0, -0.0, 1e-7, 65504.0])
                          for _ in range(size)]
            else:
                info = np.iinfo(dtype)
                values = [rng.choice([rng.randint(int(info.min), int(info.max)), 0, int(info.min), int(info.max)])
                          for _ in range(size)]
            name = rng.choice(["w", "bias", "layer.%d.kernel" % k, "embedding/table", "x" * 40, "ü"]) + str(k)
            tensors[name] = {"dtype": dtype, "shape": shape, "values": values}
        metadata = {rng.choice(["step", "format", "note"]) + str(j): rng.choice(["1", "pt", "", "ünïcode", "a b"])
                    for j in range(rng.randint(0, 2))}
        out.append({"how": rng.choice(["read", "write"]), "path": os.path.join(directory, "case%d.safetensors" % i),
                    "tensors": tensors, "metadata": metadata})
    return out


def _st_arrays(c):
    return {name: np.array(t["values"], dtype=t["dtype"]).reshape(t["shape"]) for name, t in c["tensors"].items()}


def _st_read(path):
    from safetensors import safe_open
    from safetensors.numpy import load_file
    with safe_open(path, framework="np") as f:
        metadata = {k: v for k, v in (f.metadata() or {}).items() if not k.startswith("distribute.")}
    tensors = {}
    for name, a in load_file(path).items():
        vals = [bool(x) for x in a.reshape(-1)] if a.dtype == np.bool_ else a.reshape(-1).tolist()
        tensors[name] = {"dtype": a.dtype.name, "shape": list(a.shape), "values": vals}
    return {"tensors": tensors, "metadata": metadata}


def safetensors_tf(c):
    """"read": Python writes the file (safetensors.numpy.save_file) and reads it back, which our read
    must match. "write": what Python reads from the file ours wrote (called after the runner)."""
    if c["how"] == "read":
        from safetensors.numpy import save_file
        save_file(_st_arrays(c), c["path"], metadata=c["metadata"] or None)
    return _st_read(c["path"])


# ---- IndexedSlices across replicas: all_reduce and strategy.reduce ---------------------------------

def _rows(rng, dtype, count):
    if dtype.startswith("float"):
        return [round(rng.uniform(-100, 100), 3) for _ in range(count)]
    return [rng.choice([rng.randint(-1000, 1000)] * 8 + [2**31 - 1, -2**31]) for _ in range(count)]


def _array(values, dtype, shape):
    return np.array([float("nan") if x == "nan" else x for x in values], dtype).reshape(shape)


def _slices_json(s):
    return {"indices": [int(i) for i in s.indices.numpy()], "values": _tensor_json(s.values),
            "dense_shape": [int(d) for d in s.dense_shape.numpy()]}


def sparse_reduce_gen(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(1, 4)
        how = rng.choice(["all_reduce", "all_reduce", "reduce"])
        dtype = rng.choice(["float32", "float64", "int32"])
        dense_shape = [rng.randint(1, 6)] + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        width = int(np.prod(dense_shape[1:]))
        slices = []
        for _ in range(n):
            k = rng.choice([0, 0, 1, 2, 3, 5])
            slices.append({"indices": [rng.randrange(dense_shape[0]) for _ in range(k)],
                           "values": _rows(rng, dtype, k * width), "dense_shape": list(dense_shape)})
        if how == "all_reduce" and n > 1 and not any(x["indices"] for x in slices):
            slices[rng.randrange(n)].update(indices=[0], values=_rows(rng, dtype, width))  # none: TF dies (SIGSEGV)
        if n > 1 and rng.random() < 0.04:  # TF keeps each replica's dense shape; ours refuses (docs/semantics.md)
            slices[rng.randrange(n)]["dense_shape"][0] += rng.randint(1, 2)
        dense = None
        # A dense value rides along with float slices only: TF refuses any int32 value in such a call
        # ("Inputs to batch_reduce_to must be either all on the host or all on the compute devices").
        if how == "all_reduce" and dtype != "int32" and rng.random() < 0.4:
            shape = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
            ddtype = rng.choice(["float32", "float64"])
            dense = {"dtype": ddtype, "components": [{"shape": shape, "values": _rows(rng, ddtype, int(np.prod(shape)))}
                                                    for _ in range(n)]}
        op = rng.choice(["SUM", "sum"] if dtype == "int32" else ["SUM", "MEAN", "sum", "Mean"])
        out.append({"replicas": n, "how": how, "op": op, "dtype": dtype, "slices": slices, "dense": dense})
    return out


def sparse_reduce_tf(c):
    s = strategy(c["replicas"])
    op = c["op"].upper()

    def mine():
        x = c["slices"][int(tf.distribute.get_replica_context().replica_id_in_sync_group)]
        values = _array(x["values"], c["dtype"], [len(x["indices"])] + x["dense_shape"][1:])
        return tf.IndexedSlices(tf.constant(values), tf.constant(x["indices"], tf.int64),
                                tf.constant(x["dense_shape"], tf.int64))

    if c["how"] == "reduce":
        return _slices_json(s.reduce(op, s.run(mine), axis=None))

    def step():
        ctx = tf.distribute.get_replica_context()
        if c["dense"] is None:
            return ctx.all_reduce(op, mine())
        x = c["dense"]["components"][int(ctx.replica_id_in_sync_group)]
        return ctx.all_reduce(op, (mine(), tf.constant(_array(x["values"], c["dense"]["dtype"], x["shape"]))))

    out = []
    for r in s.experimental_local_results(s.run(step)):
        out.append(_slices_json(r) if c["dense"] is None else [_slices_json(r[0]), _tensor_json(r[1])])
    return out


# ---- plain variables: scatter_* and sparse_read --------------------------------------------------

_SCATTERS = ["scatter_add", "scatter_sub", "scatter_update", "scatter_min", "scatter_max"]


def _update_rows(rng, dtype, count):
    """Rows to scatter: floats sometimes NaN (min and max then keep the row, as Eigen's)."""
    return [x if dtype == "int32" or rng.random() > 0.03 else "nan" for x in _rows(rng, dtype, count)]


def scatter_gen(rng, count):
    out = []
    for _ in range(count):
        dtype = rng.choice(["float32", "float64", "int32"])
        shape = [rng.choice([0, 1, 2, 3, 5, 6, 6])] + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        rows, width = shape[0], int(np.prod(shape[1:]))
        ops = []
        for _ in range(rng.randint(1, 5)):
            op = rng.choice(_SCATTERS * 2 + ["sparse_read"] * 3)
            k = rng.choice([0, 1, 2, 3, 4, 6]) if rows else 0
            indices = [rng.randrange(rows) for _ in range(k)]
            if op == "sparse_read":
                index_shape = rng.choice([[k]] * 6 + [[1, k], [k, 1]] + [[]] * (k == 1))
                ops.append({"op": op, "indices": indices, "index_shape": index_shape})
            else:
                ops.append({"op": op, "indices": indices, "values": _update_rows(rng, dtype, k * width),
                            "dense_shape": list(shape), "dtype": dtype})
        # At most one operation to refuse, the last, so that what is refused is known: an index out of
        # range (both refuse), a scalar variable (both), rows of another dtype (both), slices of another
        # dense shape whose indices fit the variable (TF ignores the dense shape; ours refuses). Never
        # rows of another width: TF does not check them and writes past the variable's memory.
        bad = rng.choice([None] * 20 + ["index", "read_index", "scalar", "dtype", "dense_shape"])
        if bad in ("index", "read_index"):
            op = "sparse_read" if bad == "read_index" else rng.choice(_SCATTERS)
            indices = [rng.randrange(rows) for _ in range(rng.randint(0, 2)) if rows]
            indices.insert(rng.randint(0, len(indices)), rng.choice([-1, rows, rows + 3]))
            if op == "sparse_read":
                ops.append({"op": op, "indices": indices, "index_shape": [len(indices)]})
            else:
                ops.append({"op": op, "indices": indices, "values": _update_rows(rng, dtype, len(indices) * width),
                            "dense_shape": list(shape), "dtype": dtype})
        elif bad == "scalar":
            shape = []
            op = rng.choice(_SCATTERS + ["sparse_read"])
            ops = [{"op": op, "indices": [0], "index_shape": [1]} if op == "sparse_read" else
                   {"op": op, "indices": [0], "values": _update_rows(rng, dtype, 1), "dense_shape": [1],
                    "dtype": dtype}]
        elif bad == "dtype":
            other = rng.choice([d for d in ("float32", "float64", "int32") if d != dtype])
            k = 1 if rows else 0
            ops.append({"op": rng.choice(_SCATTERS), "indices": [0] * k, "values": _rows(rng, other, k * width),
                        "dense_shape": list(shape), "dtype": other})
        elif bad == "dense_shape":
            k = rng.randint(0, 2) if rows else 0
            ops.append({"op": rng.choice(_SCATTERS), "indices": [rng.randrange(rows) for _ in range(k)],
                        "values": _update_rows(rng, dtype, k * width),
                        "dense_shape": [rows + rng.randint(1, 3)] + shape[1:], "dtype": dtype})
        size = int(np.prod(shape)) if shape else 1
        initial = _rows(rng, dtype, size)
        if dtype != "int32" and size and rng.random() < 0.2:
            initial[rng.randrange(size)] = "nan"
        out.append({"dtype": dtype, "shape": shape, "initial": initial, "ops": ops})
    return out


def scatter_tf(c):
    v = tf.Variable(_array(c["initial"], c["dtype"], c["shape"]))
    reads = []
    for o in c["ops"]:
        if o["op"] == "sparse_read":
            ids = np.array(o["indices"], np.int64).reshape(o["index_shape"])
            reads.append(_tensor_json(v.sparse_read(tf.constant(ids))))
            continue
        values = _array(o["values"], o["dtype"], [len(o["indices"])] + o["dense_shape"][1:])
        getattr(v, o["op"])(tf.IndexedSlices(tf.constant(values), tf.constant(o["indices"], tf.int64),
                                             tf.constant(o["dense_shape"], tf.int64)))
    return {"reads": reads, "final": _tensor_json(v.read_value())}


AREAS = {
    "device": (device_gen, device_tf),
    "tf_config": (tf_config_gen, tf_config_tf),
    "partitioner": (partitioner_gen, partitioner_tf),
    "values": (values_gen, values_tf),
    "dataset": (dataset_gen, dataset_tf),
    "sharded": (sharded_gen, sharded_tf),
    "safetensors": (safetensors_gen, safetensors_tf),
    "sparse_reduce": (sparse_reduce_gen, sparse_reduce_tf),
    "scatter": (scatter_gen, scatter_tf),
}


def run_one(case):
    """(True, value) or (False, TF's error) for one case."""
    try:
        return True, AREAS[case["area"]][1](case["input"])
    except Exception as e:  # TF refuses the case
        return False, f"{type(e).__name__}: {e}".splitlines()[0][:300]


if __name__ == "__main__":
    # Serve mode: cases on stdin, one [id, ok, value] per line on stdout. driver.py runs the cases
    # of one replica count per process: TF's collectives of MirroredStrategies of different sizes
    # in one process share group keys and abort ("joining a group with size 4, but that group
    # has size 3"), and a failed collective poisons the process's later ones.
    import sys
    for line in sys.stdin:
        case = json.loads(line)
        ok, value = run_one(case)
        sys.stdout.write(json.dumps([case["id"], ok, value]) + "\n")
    sys.stdout.flush()
