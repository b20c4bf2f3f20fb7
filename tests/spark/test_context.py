"""get_context() inside real runs: each rank's loader over its equal shard, reports, checkpoints."""
import pytest
from pyspark.sql import functions as F

from spark_dist import Distributor, TrainingFailedError, get_context
from spark_dist.data import DatasetError


def skewed(spark):
    """1,000 rows in very uneven files (900 / 50 / 50): Petastorm's own sharding would hang DDP here."""
    df = spark.range(0, 900, numPartitions=1).union(spark.range(900, 1000, numPartitions=2))
    return df.select("id", F.array(F.col("id").cast("float"), F.lit(1.0)).alias("features"),
                     (F.col("id") % 10).alias("label"))


def read_with_allreduce_per_batch(epochs):
    """Every batch ends in an all-reduce: one rank with an extra batch would hang the run (and the test)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ctx = get_context()
    seen, counts = [], []
    for epoch in range(epochs):
        batches = 0
        for batch in ctx.loader("train", batch_size=32, epoch=epoch):
            assert batch["features"].dtype == torch.float32 and batch["label"].dtype == torch.int64
            dist.all_reduce(torch.ones(1))
            seen.append(batch["id"].tolist())
            batches += 1
        counts.append(batches)
        ctx.report(input_wait_seconds=0.5)  # a metric of the user's, named as the rank's own statistics are
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, {"counts": counts, "ids": seen})
    dist.destroy_process_group()
    return everyone


def horovod_read(epochs):
    import horovod.torch as hvd
    import torch

    hvd.init()
    ctx = get_context()
    counts = []
    for epoch in range(epochs):
        n = 0
        for _ in ctx.loader("train", batch_size=32, epoch=epoch):
            hvd.allreduce(torch.ones(1), name=f"b{epoch}.{n}")
            n += 1
        counts.append(n)
    return hvd.allgather_object(counts)


def _check_equal_shards(everyone, epochs):
    counts = [r["counts"] for r in everyone]
    assert counts[0] == counts[1] and all(c == 1000 // 2 // 32 for c in counts[0])
    per_epoch = []
    for epoch in range(epochs):
        ids = [i for r in everyone for b in r["ids"][epoch * counts[0][0]:(epoch + 1) * counts[0][0]] for i in b]
        assert len(ids) == len(set(ids))  # no row twice across ranks in one epoch
        per_epoch.append(ids)
    assert per_epoch[0] != per_epoch[1]  # a new order every epoch


def test_ddp_ranks_get_equal_shards_of_uneven_files(spark_local):
    df = skewed(spark_local)
    d = Distributor(num_processes=2, verbose=False)
    everyone = d.run(read_with_allreduce_per_batch, 2, datasets={"train": df})
    _check_equal_shards(everyone, 2)
    # Each rank's time waiting for input, against its training time, reaches the driver.
    assert sorted(s["rank"] for s in d.input_stats) == [0, 1]
    assert all(s["batches"] == 30 and 0 <= s["input_wait_seconds"] <= s["train_seconds"] for s in d.input_stats)
    assert [r["input_wait_seconds"] for r in d.history] == [0.5] * 4  # the user's metric: in the history


def test_local_mode_reads_the_same_way(spark_local):
    everyone = Distributor(num_processes=2, local_mode=True, verbose=False).run(
        read_with_allreduce_per_batch, 2, datasets={"train": skewed(spark_local)})
    _check_equal_shards(everyone, 2)


def test_horovod_ranks_get_equal_shards(spark_local):
    pytest.importorskip("horovod.torch")
    counts = Distributor(num_processes=2, backend="horovod", verbose=False).run(
        horovod_read, 2, datasets={"train": skewed(spark_local)})
    assert counts[0] == counts[1] == [15, 15]


def ask_for_a_dataset_that_was_not_given():
    get_context().loader("validation", batch_size=8)


def test_asking_for_a_missing_dataset_names_those_given(spark_local):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(ask_for_a_dataset_that_was_not_given,
                                                        datasets={"train": skewed(spark_local)})
    assert "dataset 'validation' was not given to run(datasets=...); given: train" in str(info.value)


def test_unsupported_column_is_refused_before_any_job(spark_local):
    from spark_jobs import jobs_started

    df = spark_local.createDataFrame([({"a": 1}, 1)], "tags map<string,int>, label long")
    before = jobs_started(spark_local)  # every job, whatever its group: a run's and a dataset write's too
    with pytest.raises(DatasetError, match="tags"):
        Distributor(num_processes=2, verbose=False).run(read_with_allreduce_per_batch, 1, datasets={"train": df})
    assert jobs_started(spark_local) == before
