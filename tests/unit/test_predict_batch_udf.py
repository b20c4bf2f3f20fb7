"""spark_dist.predict_batch_udf against PySpark's, without a JVM: both UDFs' bodies (``udf.func``) run on the
batches Spark hands them: PySpark's on the pandas objects a scalar-iterator pandas UDF receives (a Series per
column, a DataFrame for a struct, a tuple for several arguments); ours on the same, or, where PySpark has Arrow
UDFs (>= 4.1) and ours is one, on the Arrow arrays of the same data. Both must yield the same values of the
return type (as Spark converts them) or fail with the same error. tests/spark/test_predict_batch_udf_parity.py
runs the UDFs in Spark."""
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.rdd import PythonEvalType
from pyspark.ml.functions import predict_batch_udf as pyspark_udf
from pyspark.sql.types import (
    ArrayType, BooleanType, DoubleType, FloatType, LongType, StringType, StructField, StructType,
)

from spark_dist import ConfigError, predict_batch_udf
from spark_dist.inference import cache

SUMS = StructType([StructField("sum1", DoubleType()), StructField("sum2", DoubleType())])
DOUBLED = StructType([StructField("t1x2", ArrayType(DoubleType())), StructField("t2x2", ArrayType(DoubleType()))])


def rows(n, width, start=0.0):
    """An array column as Spark's Arrow conversion gives it: an object Series of 1-D float64 arrays."""
    return pd.Series([np.arange(width, dtype=np.float64) + start + i for i in range(n)])


def scalars(n, dtype=np.float64):
    return pd.Series(np.arange(n).astype(dtype))


def fn(predict):
    return lambda: predict


# (name, predict, batches (each as the UDF receives it), return type, batch size, input_tensor_shapes)
CASES = [
    ("scalar", lambda x: x * 2, [scalars(7)], FloatType(), 3, None),
    ("scalar_2d_output", lambda x: (x * 2).reshape(-1, 1), [scalars(5, np.int64)], LongType(), 2, None),
    ("tensor_sum", lambda x: x.sum(axis=1), [rows(6, 4)], DoubleType(), 4, [[4]]),
    ("tensor_reshape", lambda x: x.reshape(len(x), -1) * (x.shape[1:] == (2, 2)), [rows(5, 4)],
     ArrayType(DoubleType()), 2, [[2, 2]]),
    ("two_scalar_inputs", lambda a, b: a + b, [(scalars(5), scalars(5, np.int64))], DoubleType(), 2, None),
    ("struct_of_columns", lambda a, b: {"sum1": a.sum(1), "sum2": b.sum(1)}, [(rows(5, 4), rows(5, 3))], SUMS, 2,
     [[4], [3]]),
    ("struct_of_arrays", lambda a, b: {"t1x2": a * 2, "t2x2": b * 2}, [(rows(5, 4), rows(5, 3))], DOUBLED, 3,
     [[4], [3]]),
    ("list_of_dicts", lambda a, b: [{"sum1": a[i].sum(), "sum2": b[i].sum()} for i in range(len(a))],
     [(rows(5, 4), rows(5, 3))], SUMS, 2, [[4], [3]]),
    ("list_of_dicts_arrays", lambda a, b: [{"t1x2": a[i] * 2, "t2x2": b[i] * 2} for i in range(len(a))],
     [(rows(4, 4), rows(4, 3))], DOUBLED, 3, [[4], [3]]),
    ("sparse_shapes", lambda a, b: a + b.sum(1), [(scalars(5), rows(5, 3))], DoubleType(), 2, {1: [3]}),
    ("struct_argument", lambda x: x.sum(1), [pd.DataFrame({"a": scalars(5), "b": scalars(5, np.int64)})],
     DoubleType(), 2, [[2]]),
    ("strings", lambda s: np.array([v.upper() for v in s]), [pd.Series(["a", "bc", "def"])], StringType(), 2, None),
    ("two_arrow_batches", lambda x: x.sum(1), [rows(3, 2), rows(4, 2, 10)], DoubleType(), 2, [[2]]),
    # errors, raised alike
    ("tensor_without_shapes", lambda x: x, [rows(3, 4)], DoubleType(), 2, None),
    ("too_many_columns", lambda a, b: a, [(scalars(3), scalars(3), scalars(3))], DoubleType(), 2, None),
    ("columns_for_one_input", lambda x: x, [(scalars(3), scalars(3))], DoubleType(), 2, None),
    ("tensors_for_one_input", lambda x: x, [(rows(3, 2), rows(3, 2))], DoubleType(), 2, [[2], [2]]),
    ("scalar_of_three", lambda x: np.stack([x, x, x], 1), [scalars(3)], DoubleType(), 2, None),
    ("short_output", lambda x: x[:-1], [scalars(4)], DoubleType(), 4, None),
    ("array_of_1d", lambda x: x.sum(1), [rows(3, 2)], ArrayType(DoubleType()), 2, [[2]]),
    # PySpark fails; we take a list as np.asarray (LENIENT)
    ("array_of_list", lambda x: [[1.0, 2.0]] * len(x), [scalars(3)], ArrayType(DoubleType()), 2, None),
    ("extra_field", lambda x: {"sum1": x, "sum2": x, "more": x}, [scalars(3)], SUMS, 2, None),
    ("struct_of_a_1d_array", lambda x: {"t1x2": x, "t2x2": x}, [scalars(3)], DOUBLED, 2, None),
    ("struct_of_a_2d_scalar", lambda x: {"sum1": x[:, None], "sum2": x}, [scalars(3)], SUMS, 2, None),
    ("struct_of_an_array", lambda x: x, [scalars(3)], SUMS, 2, None),
    ("rows_of_a_2d_array", lambda x: [{"t1x2": np.ones((2, 2)), "t2x2": np.ones(2)}] * len(x), [scalars(3)],
     DOUBLED, 2, None),
    ("rows_of_an_array_scalar", lambda x: [{"sum1": np.ones(2), "sum2": 1.0}] * len(x), [scalars(3)], SUMS, 2,
     None),
    ("wrong_shape", lambda x: x, [rows(3, 4)], DoubleType(), 3, [[3]]),
    ("shapes_for_columns", lambda a, b: a, [(rows(3, 2), scalars(3))], DoubleType(), 2, [[2]]),
    ("shape_of_a_scalar", lambda x: x, [scalars(3)], DoubleType(), 2, [[2]]),
    ("two_shapes_one_input", lambda x: x.sum(1), [rows(3, 2)], DoubleType(), 2, [[2], [2]]),
    ("struct_argument_shape", lambda x: x.sum(1), [pd.DataFrame({"a": scalars(3), "b": scalars(3)})], DoubleType(),
     2, [[3]]),
    ("unsupported_type", lambda x: x > 1, [scalars(3)], BooleanType(), 2, None),
    ("ragged_with_shape", lambda x: x.sum(1), [pd.Series([np.ones(2), np.ones(3)])], DoubleType(), 2, [[2]]),
]


def is_arrow_udf(udf) -> bool:
    return udf.evalType == getattr(PythonEvalType, "SQL_SCALAR_ARROW_ITER_UDF", None)


def as_arrow(batch):
    """A pandas UDF's input as an Arrow UDF receives the same data."""
    if isinstance(batch, tuple):
        return tuple(as_arrow(b) for b in batch)
    if isinstance(batch, pd.DataFrame):
        return pa.StructArray.from_arrays([pa.array(batch[c]) for c in batch.columns], names=list(batch.columns))
    return pa.array(batch)


def outputs(udf, batches):
    """What ``udf``'s body yields for ``batches`` (pandas UDF inputs), as Arrow arrays of its return type: a
    pandas UDF's output converted as Spark converts it, an Arrow UDF's as it is."""
    kind = to_arrow_type(udf.returnType)
    if is_arrow_udf(udf):
        yield from udf.func(iter([as_arrow(b) for b in batches]))
        return
    for out in udf.func(iter(batches)):
        if isinstance(out, pd.DataFrame):
            yield pa.StructArray.from_arrays([pa.Array.from_pandas(out[f.name]).cast(f.type, safe=False)
                                              for f in kind], fields=list(kind))
        else:
            yield pa.Array.from_pandas(out).cast(kind, safe=False)


def run(make, case):
    _, predict, batches, return_type, batch_size, shapes = case
    udf = make(fn(predict), return_type=return_type, batch_size=batch_size, input_tensor_shapes=shapes)
    try:
        return "ok", [out.to_pylist() for out in outputs(udf, batches)]
    except Exception as e:  # noqa: BLE001
        return "error", (type(e), str(e))


LENIENT = {"array_of_list"}  # PySpark fails, we do not (docs/inference.md)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_output_or_error_as_pyspark(case):
    theirs, ours = run(pyspark_udf, case), run(predict_batch_udf, case)
    if case[0] in LENIENT:
        assert theirs[0] == "error" and ours[0] == "ok", (theirs, ours)
        return
    if theirs[0] == "ok":
        assert ours == theirs
        return
    assert ours[0] == "error", ours
    their_type, their_message = theirs[1]
    our_type, our_message = ours[1]
    if case[0] in ("extra_field",):  # same message; we also name a missing field with it (PySpark: KeyError)
        assert our_message == their_message
    assert issubclass(our_type, their_type) and our_message.startswith(their_message.split(": all the")[0]), \
        (ours, theirs)


def test_an_array_column_with_no_shape_passes_its_rows_as_they_are():
    ragged = pd.Series([np.ones(2), np.ones(3), np.ones(1)])
    seen = []

    def predict(x):
        seen.append(x)
        return np.array([len(r) for r in x])

    for shapes in ([None], {}):
        udf = predict_batch_udf(fn(predict), return_type=LongType(), batch_size=2, input_tensor_shapes=shapes)
        assert [o.to_pylist() for o in outputs(udf, [ragged])] == [[2, 3], [1]]
    assert seen[0].dtype == object and len(seen[0]) == 2
    # With several inputs PySpark already does so; a one-input predict fails there.
    with pytest.raises((TypeError, ValueError)):
        list(pyspark_udf(fn(predict), return_type=LongType(), batch_size=2, input_tensor_shapes=[None])
             .func(iter([ragged])))


def test_binary_and_string_columns_reach_predict_as_objects():
    texts, blobs = pd.Series(["a", "bb", "c"], dtype=object), pd.Series([b"\x00\x01", b"", b"xyz"])

    def predict(t, b):
        assert b.dtype == object and all(isinstance(v, bytes) for v in b)
        return np.array([len(s) * 10 + len(v) for s, v in zip(t, b)])

    udf = predict_batch_udf(fn(predict), return_type=LongType(), batch_size=2)
    assert [o.to_pylist() for o in outputs(udf, [(texts, blobs)])] == [[12, 20], [13]]


def test_torch_outputs_and_empty_batches():
    import torch

    def predict(x):
        t = torch.tensor(x)
        return {"sum1": t * 2, "sum2": t + 1}

    udf = predict_batch_udf(fn(predict), return_type=SUMS, batch_size=4)
    out = list(outputs(udf, [scalars(0), scalars(3)]))
    assert len(out) == 1 and out[0].to_pylist() == [{"sum1": 2.0 * i, "sum2": i + 1.0} for i in range(3)]
    tensors = predict_batch_udf(fn(lambda x: torch.tensor(x).reshape(-1, 1)), return_type=DoubleType(),
                                batch_size=4)
    assert [o.to_pylist() for o in outputs(tensors, [scalars(2)])] == [[0.0, 1.0]]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        predict_batch_udf(fn(lambda x: x), return_type=DoubleType(), batch_size=bad)


class Model:
    """A stand-in for a model: what a weak reference can watch go."""

    def __init__(self, tag):
        self.tag = tag

    def __call__(self, x):
        return x


def test_the_cache_loads_once_per_udf_and_keeps_the_most_recent(monkeypatch):
    import weakref

    cache.clear()
    monkeypatch.setenv(cache.SIZE_ENV, "2")
    loads, models, alive_at_load = [], {}, []

    def alive():
        return sorted(tag for tag, model in models.items() if model() is not None)

    def make(tag):
        def make_predict_fn():
            alive_at_load.append(alive())  # which models are still in memory as this one loads
            loads.append(tag)
            model = Model(tag)
            models[tag] = weakref.ref(model)
            return model
        return make_predict_fn

    udfs = [predict_batch_udf(make(i), return_type=DoubleType(), batch_size=2) for i in range(3)]
    for udf in udfs[:2] + udfs[:2]:  # a reused worker: each UDF's model is loaded once
        list(outputs(udf, [scalars(3)]))
    assert loads == [0, 1]
    list(outputs(udfs[2], [scalars(3)]))  # a third: the least recently used goes
    list(outputs(udfs[1], [scalars(3)]))
    list(outputs(udfs[0], [scalars(3)]))
    assert loads == [0, 1, 2, 0] and len(cache.keys()) == 2
    # Bounded, and freed before the next model loads (README): the model evicted for model 2 (0), then the one
    # evicted for model 0's second load (2), was gone from memory when the next one's make_predict_fn ran.
    assert alive_at_load == [[], [0], [1], [1]]
    cache.clear()
    assert cache.keys() == [] and alive() == []


def test_concurrent_tasks_load_a_model_once():
    import sys
    import time

    cache.clear()
    loads, all_inside, start = [], [], threading.Barrier(4)

    def in_get_or_load(thread):
        frame = sys._current_frames().get(thread.ident)
        while frame is not None and frame.f_code.co_name != "get_or_load":
            frame = frame.f_back
        return frame is not None

    def make_predict_fn():
        # The load goes on until the three other tasks are inside get_or_load too, asking for the same key:
        # four loaders at once, however the threads were scheduled.
        loads.append(threading.get_ident())
        others = [t for t in threads if t.ident != threading.get_ident()]
        deadline = time.monotonic() + 10
        while not all(in_get_or_load(t) for t in others) and time.monotonic() < deadline:
            time.sleep(0.01)
        all_inside.append(all(in_get_or_load(t) for t in others))
        return lambda x: x

    def task():
        start.wait(10)
        cache.get_or_load("k", make_predict_fn)

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all_inside == [True]  # the other three were waiting inside get_or_load during the one load
    assert len(loads) == 1 and cache.keys() == ["k"]
    cache.clear()
    with pytest.raises(TypeError, match="make_predict_fn returned NoneType"):
        cache.get_or_load("none", lambda: None)


def test_a_task_with_a_gpu_loads_its_model_on_that_gpu(monkeypatch):
    """A stand-in for a GPU (none here): Spark's task resources and CUDA's device calls are faked; the rest runs."""
    import types

    import pyspark
    import torch

    cache.clear()
    task_gpus, devices, loads = [], [], []
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: types.SimpleNamespace(
        resources=lambda: {"gpu": types.SimpleNamespace(addresses=list(task_gpus))} if task_gpus else {})))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # as YARN sets it: Spark's address 1 is CUDA's device 1

    def make_predict_fn():
        loads.append(devices[-1] if devices else None)
        return lambda x: x

    udf = predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=2)
    for gpus in (["3"], ["1"], ["3"], []):  # tasks of one reused worker, holding the executor's two GPUs in turn
        task_gpus[:] = gpus
        list(outputs(udf, [scalars(3)]))
    assert devices == [0, 1, 0]  # each task made its own GPU current; the task without one touched nothing
    assert loads == [0, 1, 0]  # a model per GPU (the third task found GPU 0's), and one for the task without
    cache.clear()


def test_the_prefetch_thread_ends_when_its_consumer_stops_early():
    import time

    from spark_dist.inference.worker import prefetched

    def readers():
        return [t for t in threading.enumerate() if t.name == "spark_dist-predict-input"]

    before = set(readers())
    items = prefetched(iter([1, 2]), lambda x: x * 10)
    assert next(items) == 10
    time.sleep(0.2)  # the thread has read 2 and the end: both are waiting for the consumer
    items.close()
    deadline = time.monotonic() + 1.0
    while set(readers()) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not set(readers()) - before
