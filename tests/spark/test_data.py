"""spark_dist.data: DataFrames -> Petastorm cache (driver) -> equal shards of torch batches (ranks).

Each test reads as an example: prepare_datasets on the driver, make_loader once per rank.
"""
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spark_dist.data import (CACHE_DIR_CONF, DatasetError, DatasetHandle, clear_cache, make_loader,
                             prepare_datasets)
from spark_dist.data.handle import ColumnStats, describe_files
from spark_dist.data.read.loader import shard_pieces
from spark_dist.data.urls import local_path

pyspark = pytest.importorskip("pyspark")
from pyspark.ml.linalg import Vectors  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_jobs import jobs_started  # noqa: E402


_frames = {}


def same_frame(spark, key, build):
    """The same DataFrame object for the whole session, so prepare_datasets finds its cache (no Spark job)
    and the dataset fixtures below can stay function-scoped, whatever the scope of spark_local."""
    key = (spark.sparkContext.applicationId, key)
    if key not in _frames:
        _frames[key] = build(spark)
    return _frames[key]


def rank_batches(handle, world_size, **kwargs):
    """What each rank would iterate: a list of batches per rank."""
    kwargs.setdefault("batch_size", 16)
    return [list(make_loader(handle, rank=r, world_size=world_size, **kwargs)) for r in range(world_size)]


def ids_of(batches):
    return [i for b in batches for i in b["id"].tolist()]


# -- layouts: whatever the files look like, every rank gets the same number of batches -------------------------
LAYOUTS = {
    # 900 / 50 / 50 rows in three files: Petastorm's row-group round robin would give ranks 900 / 50 / 50.
    "skewed files": lambda s: s.range(0, 900, numPartitions=1).union(s.range(900, 1000, numPartitions=2)),
    "one file": lambda s: s.range(0, 1000, numPartitions=1),
    "fewer files than ranks": lambda s: s.range(0, 1000, numPartitions=2),
    "many small files": lambda s: s.range(0, 1000, numPartitions=7),
}


@pytest.fixture
def layouts(spark_local):
    dfs = {name: same_frame(spark_local, name, lambda s: make(s).select("id", (F.col("id") % 3).alias("label")))
           for name, make in LAYOUTS.items()}
    return prepare_datasets(spark_local, dfs, num_ranks=3)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_rank_yields_the_same_batches_and_no_row_twice(layouts, layout):
    handle = layouts[layout]
    per_rank = rank_batches(handle, 3, batch_size=32, epoch=0)

    counts = [len(b) for b in per_rank]
    assert counts == [len(make_loader(handle, rank=0, world_size=3, batch_size=32))] * 3 == [10] * 3
    assert all(len(b["id"]) == 32 for batches in per_rank for b in batches)   # drop_last: full batches only
    seen = [ids_of(batches) for batches in per_rank]
    everything = [i for s in seen for i in s]
    assert len(everything) == len(set(everything)) == 960     # 1000 // 3 = 333 rows a rank, 10 full batches


def test_drop_last_false_pads_so_every_row_is_seen(layouts):
    handle = layouts["skewed files"]
    per_rank = rank_batches(handle, 3, batch_size=32, drop_last=False)

    # ceil(1000 / 3) = 334 rows a rank: 10 full batches and one of 14, on every rank.
    assert [[len(b["id"]) for b in batches][-2:] for batches in per_rank] == [[32, 14]] * 3
    everything = [i for batches in per_rank for i in ids_of(batches)]
    assert set(everything) == set(range(1000)) and len(everything) == 1002   # 2 rows repeated as padding


def test_order_changes_each_epoch_and_replays_exactly(layouts):
    handle = layouts["many small files"]
    epoch0 = [ids_of(b) for b in rank_batches(handle, 3, epoch=0, seed=7)]
    epoch1 = [ids_of(b) for b in rank_batches(handle, 3, epoch=1, seed=7)]
    retry1 = [ids_of(b) for b in rank_batches(handle, 3, epoch=1, seed=7)]
    other_seed = [ids_of(b) for b in rank_batches(handle, 3, epoch=1, seed=8)]

    assert epoch1 == retry1                          # a retry replays the epoch exactly
    assert epoch0 != epoch1 and epoch1 != other_seed
    assert set(epoch0[0]) != set(epoch1[0])           # ranks see different rows from epoch to epoch

    loader = make_loader(handle, rank=1, world_size=3, batch_size=16, seed=7)
    loader.set_epoch(1)
    assert ids_of(loader) == epoch1[1]


def test_shuffle_false_reads_in_file_order(layouts):
    handle = layouts["one file"]
    assert ids_of(make_loader(handle, rank=0, world_size=1, batch_size=100, shuffle=False)) == list(range(1000))


# -- column kinds -------------------------------------------------------------------------------------------
def mixed_frame(spark):
    rows = [(i, float(i) / 2, [i, -i, 2 * i], [float(i)] * 4,
             Vectors.dense([float(i), 1.0]) if i % 2 else Vectors.sparse(2, {0: float(i)}), i % 2 == 0)
            for i in range(200)]
    return spark.createDataFrame(rows, ["id", "y", "ints", "floats", "vec", "flag"])


@pytest.fixture
def mixed(spark_local):
    return prepare_datasets(spark_local, {"mixed": same_frame(spark_local, "mixed", mixed_frame)}, num_ranks=2)["mixed"]


def test_vectors_and_arrays_become_2d_tensors(mixed):
    assert [(c.name, c.kind, c.length) for c in mixed.columns] == [
        ("id", "scalar", None), ("y", "scalar", None), ("ints", "array", 3), ("floats", "array", 4),
        ("vec", "vector", 2), ("flag", "scalar", None)]
    batch = next(iter(make_loader(mixed, rank=0, world_size=2, batch_size=10)))
    ids = batch["id"]

    assert batch["id"].dtype == torch.int64 and batch["y"].dtype == torch.float32
    assert batch["ints"].shape == (10, 3) and batch["ints"].dtype == torch.int64
    assert batch["floats"].shape == (10, 4) and batch["vec"].shape == (10, 2)
    assert batch["vec"].dtype == torch.float32 and batch["flag"].dtype == torch.bool
    assert torch.equal(batch["ints"][:, 1], -ids)
    assert torch.equal(batch["vec"][:, 0], ids.float())                     # dense and sparse alike
    assert torch.equal(batch["vec"][:, 1], (ids % 2).float())                # the sparse ones hold 0 there
    assert torch.equal(batch["y"], ids.float() / 2)


def test_columns_and_dtypes_pick_what_a_rank_loads(mixed):
    loader = make_loader(mixed, rank=1, world_size=2, batch_size=10, columns=["vec", "id"],
                         dtypes={"vec": torch.float64, "id": "int32"})
    batch = next(iter(loader))
    assert list(batch) == ["vec", "id"]
    assert batch["vec"].dtype == torch.float64 and batch["id"].dtype == torch.int32


def test_missing_column_is_named(mixed):
    with pytest.raises(DatasetError, match=r"'mixed' has no column 'label'.*id, y, ints"):
        make_loader(mixed, rank=0, world_size=2, batch_size=10, columns=["id", "label"])
    with pytest.raises(DatasetError, match="dtypes names column 'y'"):
        make_loader(mixed, rank=0, world_size=2, batch_size=10, columns=["id"], dtypes={"y": "float64"})


def test_a_share_smaller_than_one_batch_is_refused(mixed):
    with pytest.raises(DatasetError, match="100 per rank.*batch_size=128.*drop_last=False"):
        make_loader(mixed, rank=0, world_size=2, batch_size=128)
    assert len(make_loader(mixed, rank=0, world_size=2, batch_size=128, drop_last=False)) == 1


def test_handle_pickles_for_the_ranks(mixed):
    import pickle

    again = pickle.loads(pickle.dumps(mixed))
    assert again == mixed and isinstance(again, DatasetHandle)


def test_loader_times_the_wait_and_stops_its_thread_on_break(mixed):
    loader = make_loader(mixed, rank=0, world_size=2, batch_size=10)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert loader.batches == 3 and loader.rows == 30 and loader.wait_seconds >= 0
    assert not [t for t in threading.enumerate() if t.name.startswith(("spark_dist-loader", "spark_dist-decode"))]
    list(loader)
    assert loader.batches == 3 + len(loader)


# -- bad inputs: each error names the dataset and the column -----------------------------------------------
@pytest.mark.parametrize("make, column, type_name, hint", [
    (lambda s: s.range(5).select("id", F.struct("id").alias("st")), "st", "struct<id:bigint>",
     "select its fields as columns of their own (df.select('*', 'st.*').drop('st')), or turn it into one string "
     "(F.to_json('st'))"),
    (lambda s: s.range(5).select("id", F.create_map(F.lit("k"), "id").alias("m")), "m", "map<string,bigint>",
     "select the values you need as columns (F.col('m')['key']), or turn it into one string (F.to_json('m'))"),
    (lambda s: s.range(5).select("id", F.col("id").cast("decimal(10,2)").alias("price")), "price", "decimal",
     "cast it to double"),
    (lambda s: s.range(5).select(F.array(F.lit("a")).alias("words")), "words", "array<string>",
     "turn it into one string (F.to_json('words') or F.concat_ws)"),
    (lambda s: s.range(5).select(F.current_date().alias("day")), "day", "date", "cast it to a number"),
])
def test_unsupported_types_are_refused_before_any_job(spark_local, make, column, type_name, hint):
    jobs_before = spark_local.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(DatasetError) as err:
        prepare_datasets(spark_local, {"ok": spark_local.range(5), "bad": make(spark_local)}, num_ranks=1)
    assert f"dataset 'bad': column '{column}' has type {type_name}" in str(err.value)
    assert hint in str(err.value) and (err.value.dataset, err.value.column) == ("bad", column)
    assert spark_local.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before


@pytest.mark.parametrize("make, message", [
    (lambda s: s.range(10).where("id < 0"), "dataset 'bad': the DataFrame is empty"),
    (lambda s: s.range(10).select("id", F.when(F.col("id") != 3, F.col("id") * 1.0).alias("x")),
     "dataset 'bad': column 'x' has 1 null values"),
    (lambda s: s.range(10).select(F.when(F.col("id") > 7, F.array(F.array("id"))).otherwise(
        F.array(F.array("id", "id"))).alias("a")),
     "dataset 'bad': column 'a' holds nested arrays of unequal shape (at depth 2, lengths from 1 to 2)"),
    (lambda s: s.range(10).select(F.array("id", F.when(F.col("id") != 2, F.col("id"))).alias("a")),
     "dataset 'bad': column 'a' has 1 arrays holding null elements"),
    (lambda s: s.range(2), "dataset 'bad' has 2 rows, fewer than the 3 ranks"),
    # Nulls in the kinds that are no numbers, named with the way to fill them.
    (lambda s: s.range(10).select(F.expr("CASE WHEN id != 3 THEN unhex('abcd') END").alias("img")),
     "dataset 'bad': column 'img' has 1 null values; drop or fill them first, e.g. df.na.drop(subset=['img']) or fill "
     "them (F.coalesce(F.col('img'), F.lit(bytearray())))"),
    (lambda s: s.range(10).select(F.when(F.col("id") % 5 != 0, F.lit("a")).alias("s")),
     "dataset 'bad': column 's' has 2 null values; drop or fill them first, e.g. df.na.drop(subset=['s']) or fill them "
     "(df.na.fill('', subset=['s']))"),
    (lambda s: s.range(10).select(F.when(F.col("id") != 4, F.sequence(F.lit(0), "id")).alias("tokens")),
     "dataset 'bad': column 'tokens' has 1 null values; drop or fill them first, e.g. df.na.drop(subset=['tokens']) "
     "or fill them (F.coalesce(F.col('tokens'), F.array()))"),
    (lambda s: s.range(10).select(F.array(F.array("id"), F.when(F.col("id") != 2, F.array("id"))).alias("g")),
     "dataset 'bad': column 'g' has 1 rows holding null arrays at depth 2"),
    (lambda s: s.range(10).select(F.array(F.array("id", F.when(F.col("id") > 1, F.col("id")))).alias("g")),
     "dataset 'bad': column 'g' has 2 rows holding null numbers"),
])
def test_bad_values_are_named_and_leave_no_cache(spark_local, make, message):
    with pytest.raises(DatasetError) as err:
        prepare_datasets(spark_local, {"bad": make(spark_local)}, num_ranks=3)
    assert message in str(err.value)
    from spark_dist.data.prepare import registry

    assert all(e.handle.name != "bad" for e in registry._entries)


def test_arrays_of_unequal_length_are_refused_where_one_length_is_needed(spark_local):
    # A model's input (TorchEstimator's features) needs one length: fixed_length= names such columns.
    df = spark_local.range(10).select(
        F.when(F.col("id") > 7, F.array("id")).otherwise(F.array("id", "id")).alias("a"))
    with pytest.raises(DatasetError) as err:
        prepare_datasets(spark_local, {"bad": df}, num_ranks=3, fixed_length=["a"])
    assert "dataset 'bad': column 'a' holds arrays of unequal length (from 1 to 2)" in str(err.value)
    assert prepare_datasets(spark_local, {"ok": df}, num_ranks=3)["ok"].column("a").kind == "sequence"
    with pytest.raises(DatasetError, match=r"column 'a' holds arrays of unequal length \(from 1 to 2\)"):
        prepare_datasets(spark_local, {"bad": df}, num_ranks=3, fixed_length=["a"])  # the cache made above, refused


# -- every column kind a DataFrame holds reaches the rank ------------------------------------------------------
def png(i):
    """A 4x2 PNG whose pixels say the row."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 2), (i % 256, (i * 3) % 256, 7)).save(buffer, format="PNG")
    return bytearray(buffer.getvalue())


def kinds_frame(spark):
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType(), False), T.StructField("image", T.BinaryType(), False),
        T.StructField("caption", T.StringType(), False),
        T.StructField("tokens", T.ArrayType(T.IntegerType(), False), False),
        T.StructField("grid", T.ArrayType(T.ArrayType(T.DoubleType(), False), False), False),
        T.StructField("pixels", T.ArrayType(T.FloatType(), False), False)])
    rows = [(i, png(i), f"légende {i} 日本", list(range(i % 7)), [[float(i), -float(i), 0.5]] * 2, [float(i)] * 12)
            for i in range(120)]
    return spark.createDataFrame(rows, schema).repartition(3)


def check_kinds_batch(batch, left_pad=None):
    """Every column of ``batch`` holds the rows its ``id`` says."""
    import io

    from PIL import Image

    ids = batch["id"].tolist()
    assert [Image.open(io.BytesIO(b)).getpixel((3, 1)) for b in batch["image"]] == [(i % 256, i * 3 % 256, 7)
                                                                                   for i in ids]
    assert batch["caption"] == [f"légende {i} 日本" for i in ids]
    assert batch["tokens_lengths"].tolist() == [i % 7 for i in ids]
    longest = max(i % 7 for i in ids)
    for row, i in zip(batch["tokens"].tolist(), ids):
        pad = [0 if left_pad is None else left_pad] * (longest - i % 7)
        assert row == (pad + list(range(i % 7)) if left_pad is not None else list(range(i % 7)) + pad)
    assert batch["grid"].shape == (len(ids), 2, 3) and torch.equal(batch["grid"][:, 1, 1], -batch["id"].float())
    assert torch.equal(batch["pixels"][:, 2, 1, 1], batch["id"].float())


def test_every_column_kind_reaches_the_rank(spark_local):
    df = same_frame(spark_local, "kinds", kinds_frame)
    handle = prepare_datasets(spark_local, {"kinds": df}, num_ranks=2)["kinds"]
    assert [(c.name, c.kind, c.dtype) for c in handle.columns] == [
        ("id", "scalar", "int64"), ("image", "binary", "object"), ("caption", "string", "object"),
        ("tokens", "sequence", "int32"), ("grid", "nested", "float32"), ("pixels", "array", "float32")]
    assert handle.column("grid").shape == (2, 3) and handle.column("tokens").stats.length_range == (0, 6)
    assert handle.column("image").row_bytes > 50  # from the footers: what a shuffle window counts per row
    seen = []
    for rank in range(2):
        for batch in make_loader(handle, rank=rank, world_size=2, batch_size=16, pad={"tokens": -1},
                                 pad_side="left", shapes={"pixels": (3, 2, 2)}):
            check_kinds_batch(batch, left_pad=-1)
            assert batch["tokens"].dtype == torch.int64 and batch["grid"].dtype == torch.float32
            seen += batch["id"].tolist()
    assert len(seen) == len(set(seen)) == 96  # 60 rows a rank: 3 batches of 16


def read_every_kind(epochs):
    """Every rank's ids of the kinds dataset through get_context().loader, per epoch, each batch checked."""
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    out = []
    for epoch in range(epochs):
        loader = ctx.loader("kinds", batch_size=16, epoch=epoch, shapes={"pixels": (3, 2, 2)})
        ids = []
        for batch in loader:
            check_kinds_batch(batch)
            ids += batch["id"].tolist()
        ragged = next(iter(ctx.loader("kinds", batch_size=4, columns=["id", "tokens"], ragged=["tokens"])))
        assert [t.tolist() for t in ragged["tokens"]] == [list(range(i % 7)) for i in ragged["id"].tolist()]
        out.append(ids)
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, out)
    dist.destroy_process_group()
    return everyone


def test_every_column_kind_reaches_a_run(spark_local):
    from spark_dist import Distributor

    df = same_frame(spark_local, "kinds", kinds_frame)
    per_rank = Distributor(num_processes=2, verbose=False).run(read_every_kind, 2, datasets={"kinds": df})
    for epoch in range(2):
        ids = per_rank[0][epoch] + per_rank[1][epoch]
        assert len(ids) == len(set(ids)) == 96
    assert per_rank[0][0] != per_rank[0][1]


def test_rows_of_large_values_keep_row_groups_small(spark_local):
    # 300 KB a row: Parquet's writer would first look at a row group's size after 100 rows (30 MB).
    from spark_dist.data.prepare.write import ROW_GROUP_BYTES

    df = spark_local.range(0, 80, numPartitions=1).select("id", F.expr("encode(repeat('a', 300000), 'utf-8')")
                                                          .alias("blob"))
    handle = prepare_datasets(spark_local, {"blobs": df}, num_ranks=1)["blobs"]
    [url] = handle.file_urls
    metadata = pq.ParquetFile(local_path(url)).metadata
    assert metadata.num_row_groups >= 3
    assert all(metadata.row_group(g).total_byte_size <= ROW_GROUP_BYTES * 1.25 for g in range(metadata.num_row_groups))
    assert 300_000 <= handle.column("blob").row_bytes <= 300_100
    loader = make_loader(handle, rank=0, world_size=1, batch_size=8)
    assert loader._window_rows < 80  # the window counts the bytes: a few dozen rows of 300 KB, not thousands
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(80))


# -- the cache: one materialisation per DataFrame, and it goes away --------------------------------------------
def cache_dirs(spark):
    """The cache directories written so far under this session's cache parent directory."""
    from spark_dist.data.urls import local_path
    from spark_dist.data.prepare.location import _parent_url

    parent = local_path(_parent_url(spark))
    return {d for d in os.listdir(parent) if "-appid-" in d}


def test_the_same_dataframe_is_materialised_once(spark_local):
    before = cache_dirs(spark_local)
    df = spark_local.range(100).select("id", F.array("id", "id").alias("a"))

    first = prepare_datasets(spark_local, {"train": df}, num_ranks=2)["train"]
    again = prepare_datasets(spark_local, {"train": df, "same": df}, num_ranks=2)
    assert len(cache_dirs(spark_local) - before) == 1  # one write
    assert again["train"] == first and again["same"].file_urls == first.file_urls
    assert again["same"].name == "same"


def test_a_reread_of_changed_files_gets_a_new_cache(spark_local, tmp_path):
    source = str(tmp_path / "source")
    spark_local.range(100).select("id", F.array("id", "id").alias("a")).write.parquet(source)
    before = prepare_datasets(spark_local, {"train": spark_local.read.parquet(source)}, num_ranks=2)["train"]
    again = prepare_datasets(spark_local, {"train": spark_local.read.parquet(source)}, num_ranks=2)["train"]
    assert again == before  # unchanged files: the same cache, no job
    spark_local.range(60).select("id", F.array("id", "id").alias("a")).write.mode("overwrite").parquet(source)
    after = prepare_datasets(spark_local, {"train": spark_local.read.parquet(source)}, num_ranks=2)["train"]
    assert (before.num_rows, after.num_rows) == (100, 60) and after.cache_dir_url != before.cache_dir_url


def test_clear_cache_deletes_what_it_made_and_only_that(spark_local, tmp_path):
    user_dir = tmp_path / "user_cache"
    user_dir.mkdir()
    (user_dir / "keep.txt").write_text("the user's")
    spark_local.conf.set(CACHE_DIR_CONF, f"file://{user_dir}")
    try:
        handle = prepare_datasets(spark_local, {"d": spark_local.range(50)}, num_ranks=1)["d"]
    finally:
        spark_local.conf.unset(CACHE_DIR_CONF)
    default = prepare_datasets(spark_local, {"d": spark_local.range(60)}, num_ranks=1)["d"]
    dirs = [local_path(handle.cache_dir_url), local_path(default.cache_dir_url)]
    assert dirs[0].startswith(str(user_dir)) and all(os.path.isdir(d) for d in dirs)

    assert clear_cache() >= 2
    assert not any(os.path.exists(d) for d in dirs)
    assert not os.path.exists(os.path.dirname(dirs[1]))            # the default parent dir was ours
    assert (user_dir / "keep.txt").read_text() == "the user's"    # the user's dir and files stay
    assert spark_local.conf.get(CACHE_DIR_CONF, None) is None


def test_least_recently_used_caches_are_evicted_beyond_the_bound(spark_local, monkeypatch):
    from spark_dist.data.prepare import registry

    monkeypatch.setattr(registry, "MAX_CACHED_DATASETS", 2)
    a, b, c = (spark_local.range(n) for n in (70, 80, 90))  # e.g. what three Pipeline fits would pass
    first = prepare_datasets(spark_local, {"d": a}, num_ranks=1)["d"]
    second = prepare_datasets(spark_local, {"d": b}, num_ranks=1)["d"]
    prepare_datasets(spark_local, {"d": a}, num_ranks=1)  # a used again: b is now the oldest
    third = prepare_datasets(spark_local, {"d": c}, num_ranks=1)["d"]
    assert os.path.isdir(local_path(first.cache_dir_url)) and os.path.isdir(local_path(third.cache_dir_url))
    assert not os.path.exists(local_path(second.cache_dir_url))


def test_executors_on_this_host_write_and_read_a_file_cache(spark_local_cluster):
    # local-cluster: separate executor JVMs and Python workers on the driver's host; a file:// cache works.
    def _rank_ids(args):
        """One rank's ids, read in a Spark task: another process, as a rank of a run would be. (Defined here:
        cloudpickle sends a nested function by value, where the executors could not import this test module.)"""
        from spark_dist.data import make_loader

        handle, rank = args
        return sorted(i for b in make_loader(handle, rank=rank, world_size=2, batch_size=10) for i in b["id"].tolist())

    spark = spark_local_cluster
    handle = prepare_datasets(spark, {"d": spark.range(0, 1000, numPartitions=3)}, num_ranks=2)["d"]

    shards = spark.sparkContext.parallelize([(handle, 0), (handle, 1)], 2).map(_rank_ids).collect()
    assert [len(s) for s in shards] == [500, 500] and set(shards[0]) | set(shards[1]) == set(range(1000))


# -- one job per DataFrame: the write measures what the checks need ---------------------------------------------
def test_a_new_dataframe_costs_one_job_which_also_measures_it(spark_local):
    df = spark_local.range(0, 90, numPartitions=3).select(
        "id", (F.col("id") / 4).alias("quarter"), F.array("id", "id", "id").alias("a"),
        F.when(F.col("id") == 7, F.lit(float("nan"))).otherwise(F.col("id") * 1.0).alias("with nan"))
    before = jobs_started(spark_local)
    handle = prepare_datasets(spark_local, {"d": df}, num_ranks=2, value_ranges=["id", "quarter", "with nan"])["d"]
    assert jobs_started(spark_local) - before == 1   # the write; no count job, no aggregation job
    assert handle.num_rows == 90
    assert handle.column("id").stats == ColumnStats(minimum=0.0, maximum=89.0, non_integers=0)
    quarter = handle.column("quarter").stats     # measured before the cache narrowed it to float32
    assert (quarter.minimum, quarter.maximum, quarter.non_integers) == (0.0, 22.25, 90 - 23)
    assert (handle.column("with nan").stats.nans, handle.column("with nan").stats.maximum) == (1, 89.0)
    assert handle.column("a").length == 3

    again = prepare_datasets(spark_local, {"same": df, "handle": handle}, num_ranks=2)
    assert jobs_started(spark_local) - before == 1   # the same plan, and a handle, cost nothing more
    assert again["handle"].file_urls == again["same"].file_urls == handle.file_urls
    assert again["handle"].name == "handle"


def test_a_cache_the_user_made_with_petastorm_is_read_and_kept(spark_local, tmp_path):
    from petastorm.spark import make_spark_converter

    spark_local.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")
    try:
        df = spark_local.range(40).select("id", F.array("id", "id").alias("a"))
        users = make_spark_converter(df)
        handle = prepare_datasets(spark_local, {"d": df}, num_ranks=2, value_ranges=["id"])["d"]
        assert handle.cache_dir_url == users.cache_dir_url and handle.num_rows == 40
        assert handle.column("a").length == 2 and handle.column("id").stats.maximum == 39.0  # measured again
        clear_cache(spark_local)
        assert os.path.isdir(local_path(users.cache_dir_url))   # the user's cache: never deleted by us
        users.delete()
    finally:
        spark_local.conf.unset(CACHE_DIR_CONF)


def test_a_petastorm_that_fails_to_import_leaves_no_cache_behind(spark_local, tmp_path, monkeypatch):
    # The write runs before Petastorm's converter module is needed; where it then fails to import, the files
    # just written are deleted, as they are after any other failure.
    import sys

    monkeypatch.setitem(sys.modules, "petastorm.spark.spark_dataset_converter", None)  # what a broken install does
    spark_local.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")
    try:
        with pytest.raises(ImportError, match="spark_dataset_converter"):
            prepare_datasets(spark_local, {"d": spark_local.range(23).selectExpr("id", "id * 7 AS x")}, num_ranks=1)
    finally:
        spark_local.conf.unset(CACHE_DIR_CONF)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_write_that_fails_leaves_no_cache_directory(spark_local, tmp_path):
    # Spark's aborted write removes its files but keeps the directory it was given: a cache parent the user
    # named would collect one empty directory per failed prepare_datasets.
    spark_local.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")
    try:
        failing = spark_local.range(40, numPartitions=2).selectExpr(
            "id", "CASE WHEN id = 33 THEN CAST(raise_error('row 33 is bad') AS BIGINT) ELSE id END AS x")
        with pytest.raises(Exception, match="row 33 is bad"):
            prepare_datasets(spark_local, {"d": failing}, num_ranks=1)
    finally:
        spark_local.conf.unset(CACHE_DIR_CONF)
    assert list(tmp_path.iterdir()) == []


def test_a_range_not_measured_at_the_write_is_measured_when_asked(spark_local):
    df = spark_local.range(0, 30, numPartitions=2).select("id", (F.col("id") % 3).alias("label"))
    first = prepare_datasets(spark_local, {"d": df}, num_ranks=1)["d"]
    assert first.column("label").stats.minimum is None           # no range asked: none measured
    again = prepare_datasets(spark_local, {"d": df}, num_ranks=1, value_ranges=["label"])["d"]
    assert (again.column("label").stats.minimum, again.column("label").stats.maximum) == (0.0, 2.0)
    assert again.file_urls == first.file_urls                       # from the same cache


def test_doubles_with_dots_in_their_names_are_stored_as_float32(spark_local):
    df = spark_local.range(8).select(F.col("id").cast("double").alias("a.b"),
                                     F.array(F.col("id").cast("double")).alias("x`y"))
    handle = prepare_datasets(spark_local, {"d": df}, num_ranks=2)["d"]
    assert [(c.name, c.dtype) for c in handle.columns] == [("a.b", "float32"), ("x`y", "float32")]
    batch = next(iter(make_loader(handle, rank=0, world_size=2, batch_size=4, shuffle=False)))
    assert batch["a.b"].dtype == torch.float32 and batch["x`y"].shape == (4, 1)


def test_the_cache_is_plain_values_in_row_groups_of_about_8_mib(spark_local):
    # Small row groups bound what a rank decodes at a time; no dictionaries keeps the write as cheap as a plain one.
    from spark_dist.data.prepare.write import ROW_GROUP_BYTES

    df = spark_local.range(0, 120_000, numPartitions=1).select(
        F.array(*[(F.col("id") + i).cast("float") for i in range(32)]).alias("features"), (F.col("id") % 10).alias("label"))
    handle = prepare_datasets(spark_local, {"rows": df}, num_ranks=2)["rows"]
    [url] = handle.file_urls
    metadata = pq.ParquetFile(local_path(url)).metadata
    assert metadata.num_row_groups >= 2  # ~16 MB of values
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        assert group.total_byte_size <= ROW_GROUP_BYTES * 1.25
        assert not any(group.column(c).has_dictionary_page for c in range(group.num_columns))
    assert sum(len(b["label"]) for b in make_loader(handle, rank=0, world_size=2, batch_size=1000)) == 60_000


def test_two_threads_preparing_one_dataframe_write_it_once(spark_local):
    before = cache_dirs(spark_local)
    df = spark_local.range(0, 500, numPartitions=2).select("id", (F.col("id") * 2).alias("twice"))
    got = {}
    threads = [threading.Thread(target=lambda i=i: got.update({i: prepare_datasets(spark_local, {"d": df}, 2)["d"]}))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache_dirs(spark_local) - before) == 1
    assert got[0].file_urls == got[1].file_urls == got[2].file_urls


def test_a_handle_whose_cache_was_deleted_is_refused(spark_local):
    handle = prepare_datasets(spark_local, {"d": spark_local.range(20)}, num_ranks=1)["d"]
    clear_cache(spark_local)
    with pytest.raises(DatasetError, match="dataset 'again': its cache .* was deleted"):
        prepare_datasets(spark_local, {"again": handle}, num_ranks=1)


def test_a_cache_url_the_ranks_cannot_read_is_refused_before_the_write(spark_local):
    spark_local.conf.set(CACHE_DIR_CONF, "wasbs://container@account/cache")
    try:
        with pytest.raises(DatasetError, match=r"wasbs:.*parentCacheDirUrl"):
            prepare_datasets(spark_local, {"train": spark_local.range(10)}, num_ranks=2)
    finally:
        spark_local.conf.unset(CACHE_DIR_CONF)
