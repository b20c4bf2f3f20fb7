"""spark_dist.predict_batch_udf on a Structured Streaming DataFrame, on local[2]: a parquet source the test
writes into while the query runs, the UDF applied, a parquet sink (exactly once, through its commit log) read
back: every row predicted once and right, over several micro-batches, the model loaded once per Python worker
for all of them. (TorchModel.transform on a stream: tests/spark/test_ml_transform_inputs.py.)"""
import collections

import numpy as np
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType, StructField, StructType

from spark_dist import predict_batch_udf

LOADS = collections.Counter()  # in each Python worker: make_predict_fn calls there
OUT = StructType([StructField("doubled", ArrayType(FloatType())), StructField("loads", LongType())])


def doubling_model():
    """A model whose output says how often this worker loaded it."""
    LOADS["doubling"] += 1
    loads = LOADS["doubling"]
    return lambda x: {"doubled": x * 2, "loads": np.full(len(x), loads)}


def write_rows(spark, folder, start, stop):
    """Rows id in [start, stop) with x = [id, id + 0.5], added to ``folder`` as two new parquet files."""
    (spark.range(start, stop, 1, 2).withColumn("x", F.array(F.col("id").cast("double"), F.col("id") + 0.5))
     .write.mode("append").parquet(str(folder)))


def test_a_stream_from_files_is_predicted_once_per_row(spark_local, tmp_path):
    source, sink = tmp_path / "in", tmp_path / "out"
    write_rows(spark_local, source, 0, 30)
    schema = StructType([StructField("id", LongType()), StructField("x", ArrayType(DoubleType()))])
    stream = spark_local.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    assert stream.isStreaming
    udf = predict_batch_udf(doubling_model, return_type=OUT, batch_size=4, input_tensor_shapes=[[2]])
    query = (stream.withColumn("preds", udf("x")).writeStream.format("parquet")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start(str(sink)))
    try:
        query.processAllAvailable()
        write_rows(spark_local, source, 30, 50)  # files arriving while the query runs
        query.processAllAvailable()
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()
    assert query.exception() is None
    assert len(batches) >= 4  # one file a trigger: the first two files and the two that came later
    rows = spark_local.read.parquet(str(sink)).collect()
    assert sorted(r["id"] for r in rows) == list(range(50))  # every row once
    for r in rows:
        assert r["preds"]["doubled"] == [2.0 * r["id"], 2.0 * r["id"] + 1.0]
    assert {r["preds"]["loads"] for r in rows} == {1}  # one load per worker, kept across the micro-batches
