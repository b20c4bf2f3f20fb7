"""PySpark's predict_batch_udf and spark_dist's, side by side in Spark: the same make_predict_fn over the same
DataFrame gives the same rows, or the same error. The cases follow PySpark's documented examples (scalar, array
and struct returns, a list of dicts, reshaped tensors, several input columns, batches smaller than a
partition); tests/unit/test_predict_batch_udf.py compares the two bodies on many more inputs without a JVM.
"""
import collections
import functools

import numpy as np
import pytest
from pyspark.ml.functions import predict_batch_udf as pyspark_predict_batch_udf
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType, StructField, StructType

from spark_dist import predict_batch_udf

UDFS = [pytest.param(pyspark_predict_batch_udf, id="pyspark"), pytest.param(predict_batch_udf, id="spark_dist")]
SUMS = StructType([StructField("sum1", FloatType()), StructField("sum2", FloatType())])
DOUBLED = StructType([StructField("t1x2", ArrayType(FloatType())), StructField("t2x2", ArrayType(FloatType()))])
LOADS = collections.Counter()  # in each Python worker: make_predict_fn calls there, by tag


def frame(spark, rows=20):
    """id, a (double), t1 = [a, a+1, a+2, a+3], t2 = [a, a+1, a+2]; two partitions."""
    a = F.col("id").cast("double")
    return (spark.range(0, rows, 1, 2).withColumn("a", a)
            .withColumn("t1", F.array(a, a + 1, a + 2, a + 3)).withColumn("t2", F.array(a, a + 1, a + 2)))


def times_two():
    return lambda x: x * 2


def sum_rows():
    return lambda x: np.sum(x, axis=1)


def reshaped():  # [rows, 2, 2] in, the rows flattened again out
    def predict(x):
        assert x.shape[1:] == (2, 2)
        return x.reshape(len(x), 4) + 1
    return predict


def column_sums():
    return lambda x1, x2: {"sum1": np.sum(x1, axis=1), "sum2": np.sum(x2, axis=1)}


def doubled():
    return lambda x1, x2: {"t1x2": x1 * 2, "t2x2": x2 * 2}


def row_sums():
    return lambda x1, x2: [{"sum1": np.sum(x1[i]), "sum2": np.sum(x2[i])} for i in range(len(x1))]


def four_inputs():
    return lambda x1, x2, x3, x4: x1 + x2 + x3 + x4


def batch_lengths():
    return lambda x: np.full(len(x), len(x))


def counting(tag):
    LOADS[tag] += 1
    return lambda x: np.full(len(x), LOADS[tag])


def collected(df, column):
    return [r[column] for r in df.orderBy("id").collect()]


CASES = {
    "scalar": (times_two, FloatType(), 10, None, ("a",)),
    "array_reshaped": (reshaped, ArrayType(FloatType()), 4, [[2, 2]], ("t1",)),
    "tensor_to_scalar": (sum_rows, FloatType(), 10, [[4]], ("t1",)),
    "array_of_scalars": (sum_rows, FloatType(), 10, [[4]], (lambda: F.array("a", "a", "id", "id"),)),
    "struct_of_columns": (column_sums, SUMS, 5, [[4], [3]], ("t1", "t2")),
    "struct_of_arrays": (doubled, DOUBLED, 5, [[4], [3]], ("t1", "t2")),
    "list_of_dicts": (row_sums, SUMS, 5, {0: [4], 1: [3]}, ("t1", "t2")),
    "four_input_columns": (four_inputs, DoubleType(), 10, None,
                           ("a", "id", lambda: (F.col("a") + 1).alias("b"), lambda: (F.col("id") * 2).alias("c"))),
    "batches_within_a_partition": (batch_lengths, LongType(), 3, None, ("a",)),
}


@pytest.fixture
def udf_rows(spark_local):
    """The rows each UDF makes of one case: {"pyspark": [...], "spark_dist": [...]}."""
    df = frame(spark_local)

    def run(case):
        make, return_type, batch_size, shapes, columns = CASES[case]
        out = {}
        for param in UDFS:
            udf = param.values[0](make, return_type=return_type, batch_size=batch_size, input_tensor_shapes=shapes)
            args = [c() if callable(c) else c for c in columns]  # a Column needs the session
            out[param.id] = collected(df.withColumn("out", udf(*args)), "out")
        return out
    return run


@pytest.mark.parametrize("case", list(CASES))
def test_same_rows_as_pyspark(udf_rows, case):
    out = udf_rows(case)
    assert out["spark_dist"] == out["pyspark"]
    if case == "batches_within_a_partition":  # 10 rows a partition, 3 a batch
        assert out["spark_dist"] == [3] * 9 + [1] + [3] * 9 + [1]
    if case == "struct_of_columns":
        assert out["spark_dist"][1].asDict() == {"sum1": 10.0, "sum2": 6.0}


@pytest.mark.parametrize("make_udf", UDFS)
def test_same_errors_as_pyspark(spark_local, make_udf):
    from pyspark.errors import PythonException

    df = frame(spark_local, rows=4)
    bad = [  # (make_predict_fn, return_type, shapes, columns, the message in the task's error)
        (sum_rows, ArrayType(FloatType()), [[4]], ("t1",), "Prediction results for ArrayType must be two-dimensional"),
        (column_sums, SUMS, [[4], [3]], ("t1", "t2", "a"), "Model expected 2 inputs, but received 3 columns"),
    ]  # (the other messages: tests/unit/test_predict_batch_udf.py)
    for make, return_type, shapes, columns, message in bad:
        udf = make_udf(make, return_type=return_type, batch_size=2, input_tensor_shapes=shapes)
        with pytest.raises(PythonException, match=message):
            df.select(udf(*columns)).collect()


@pytest.mark.parametrize("make_udf", UDFS)
def test_the_model_is_loaded_once_per_python_worker(spark_local, make_udf):
    tag = make_udf.__module__
    udf = make_udf(functools.partial(counting, tag), return_type=LongType(), batch_size=4)
    df = frame(spark_local)
    for _ in range(2):  # two jobs, four tasks: reused workers keep the loaded predict function
        assert set(collected(df.withColumn("loads", udf("a")), "loads")) == {1}


def test_a_column_given_twice(spark_local):
    """Ours only: PySpark picks its inputs by column name, so a repeated column reaches predict as a 2-D array
    (and fails with 'Invalid shape for scalar prediction result.'); ours go by position."""
    udf = predict_batch_udf(four_inputs, return_type=DoubleType(), batch_size=10)
    assert collected(frame(spark_local, rows=4).withColumn("out", udf("a", "id", "a", "id")), "out") == [0, 4, 8, 12]


def lengths_and_bytes():
    def predict(text, blob, seq):
        assert text.dtype == object and blob.dtype == object and seq.dtype == object
        return {"n": np.array([len(t) * 100 + len(b) * 10 + len(s) for t, b, s in zip(text, blob, seq)]),
                "last": np.array([s[-1] for s in seq], dtype=np.float64)}
    return predict


def sequence_lengths():
    return lambda seq: np.array([len(s) for s in seq])


def test_string_binary_and_variable_length_columns(spark_local):
    """Ours only: str, bytes and arrays of any length reach predict as object arrays."""
    df = spark_local.range(0, 6, 1, 2).selectExpr(
        "id", "repeat('x', cast(id as int)) AS text", "encode(repeat('ab', cast(id % 3 as int)), 'utf-8') AS blob",
        "cast(sequence(0, id) AS array<double>) AS seq")
    udf = predict_batch_udf(lengths_and_bytes, return_type="struct<n: long, last: double>", batch_size=4,
                            input_tensor_shapes=[None, None, None])
    rows = [r.asDict() for r in collected(df.withColumn("out", udf("text", "blob", "seq")), "out")]
    assert rows == [{"n": i * 100 + 2 * (i % 3) * 10 + i + 1, "last": float(i)} for i in range(6)]
    one_input = predict_batch_udf(sequence_lengths, return_type=LongType(), batch_size=4, input_tensor_shapes=[None])
    assert collected(df.withColumn("n", one_input("seq")), "n") == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("make_udf", UDFS)
def test_struct_return_through_spark_connect(spark_connect, make_udf):
    udf = make_udf(column_sums, return_type=SUMS, batch_size=3, input_tensor_shapes=[[4], [3]])
    rows = collected(frame(spark_connect, rows=6).withColumn("out", udf("t1", "t2")), "out")
    assert [r.asDict() for r in rows] == [{"sum1": 4 * i + 6.0, "sum2": 3 * i + 3.0} for i in range(6)]
