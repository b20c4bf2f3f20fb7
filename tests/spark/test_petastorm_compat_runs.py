"""Petastorm 0.12.1 as a user calls it, after ``import spark_dist``, on either Spark line.

On the Spark 4 line (pyarrow >= 16, numpy 2) Petastorm cannot even be imported by itself; spark_dist's
compatibility module supplies what it needs, to Petastorm alone. On the 3.5 line it must change nothing.
"""
import os
import subprocess
import sys

import numpy as np
import pyarrow
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import spark_dist  # noqa: F401 -- what the user imports first
from spark_dist.data.prepare import petastorm_compat


def _frame(spark, rows=1000):
    return spark.range(rows).select(F.array(F.col("id").cast("float"), F.lit(2.0)).alias("x"),
                                    (F.col("id") * 0.5).alias("half"), F.col("id").alias("label"))


def test_users_own_converter_and_torch_loader_work(spark_local, tmp_path):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark_local.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + str(tmp_path))
    try:
        converter = make_spark_converter(_frame(spark_local))
        assert len(converter) == 1000
        labels, rows_ok = [], True
        with converter.make_torch_dataloader(batch_size=128, num_epochs=1) as loader:
            for batch in loader:
                labels += batch["label"].tolist()
                expected_x = np.stack([batch["label"].numpy().astype(np.float32),
                                       np.full(len(batch["label"]), 2.0, np.float32)], axis=1)
                rows_ok &= bool(np.array_equal(batch["x"].numpy(), expected_x))
                rows_ok &= bool(np.allclose(batch["half"].numpy(), batch["label"].numpy() * 0.5))
        assert sorted(labels) == list(range(1000)) and rows_ok

        shards = []
        for shard in range(2):
            with converter.make_torch_dataloader(batch_size=100, num_epochs=1, cur_shard=shard,
                                                 shard_count=2) as loader:
                shards.append({v for batch in loader for v in batch["label"].tolist()})
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(1000))

        cache_dir = converter.cache_dir_url[len("file://"):]
        assert os.listdir(cache_dir)
        converter.delete()
        assert not os.path.exists(cache_dir)
    finally:
        spark_local.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


def test_make_batch_reader_reads_a_plain_parquet_directory(spark_local, tmp_path):
    from petastorm import make_batch_reader

    path = str(tmp_path / "plain")
    _frame(spark_local, 300).repartition(3).write.parquet(path)
    with make_batch_reader("file://" + path, num_epochs=1) as reader:
        labels = [v for batch in reader for v in batch.label.tolist()]
    assert sorted(labels) == list(range(300))


def test_partitioned_datasets_are_refused_clearly(spark_local, tmp_path):
    from spark_dist.data.prepare.petastorm_legacy_dataset import ParquetDataset

    path = str(tmp_path / "parted")
    _frame(spark_local, 10).withColumn("part", F.col("label") % 2).write.partitionBy("part").parquet(path)
    with pytest.raises(NotImplementedError, match="partitioned"):
        ParquetDataset(path)


def test_legacy_dataset_lists_pieces_and_reads_row_groups(spark_local, tmp_path):
    from spark_dist.data.prepare.petastorm_legacy_dataset import ParquetDataset

    path = str(tmp_path / "pieces")
    _frame(spark_local, 50).repartition(2).write.parquet(path)
    dataset = ParquetDataset(path, validate_schema=False, metadata_nthreads=10)
    assert len(dataset.pieces) == 2 and dataset.partitions is None and dataset.common_metadata is None
    assert [p.path for p in dataset.pieces] == sorted(p.path for p in dataset.pieces)
    total = sum(piece.read(columns={"label"}).num_rows for piece in dataset.pieces)
    assert total == 50 == sum(piece.get_metadata().num_rows for piece in dataset.pieces)


def test_materialize_dataset_writes_its_row_group_summary_in_spark_workers(spark_local, tmp_path):
    # Its default summary is a Spark job whose Python workers run Petastorm's closures (pickled on this driver):
    # on the Spark 4 line they need the patch there too (petastorm_compat._rebuilt).
    from petastorm import make_reader
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import ROW_GROUPS_PER_FILE_KEY, materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import IntegerType

    schema = Unischema("Summary", [UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
                                   UnischemaField("m", np.float32, (2,), NdarrayCodec(), False)])
    url = "file://" + str(tmp_path / "ds")
    rows = [dict_to_spark_row(schema, {"id": np.int32(i), "m": np.full(2, i, np.float32)}) for i in range(20)]
    with materialize_dataset(spark_local, url, schema, 1):   # use_summary_metadata=False: Petastorm's own job
        spark_local.createDataFrame(rows, schema.as_spark_schema()).repartition(2).write.parquet(url)
    assert ROW_GROUPS_PER_FILE_KEY in pq.read_metadata(str(tmp_path / "ds" / "_common_metadata")).metadata
    with make_reader(url, reader_pool_type="dummy", num_epochs=1) as reader:
        assert sorted((int(r.id), r.m.tolist()) for r in reader) == [(i, [float(i)] * 2) for i in range(20)]
