"""What Petastorm users already have, as ``datasets=``: their SparkDatasetConverter, and a Petastorm dataset's URL.

Side by side with Petastorm's own readers: the ids a run's ranks read equal those ``make_torch_dataloader``
yields (as sets: Petastorm's order differs), and every decoded value equals what ``make_reader`` yields for the
same id. Petastorm's ``CompressedImageCodec`` needs OpenCV, which is not installed here: a stand-in on Pillow
(lossless PNG: the same pixels) serves Petastorm's codec in this process; the ranks decode with Pillow.
"""
import io
import os
import time
import types

import numpy as np
import pytest
import torch

from spark_dist import Distributor  # first: Petastorm imports after spark_dist on either Spark line
from spark_dist.data import DatasetError, clear_cache, prepare_datasets
from spark_dist.data.urls import local_path

pyspark = pytest.importorskip("pyspark")
from petastorm.codecs import NdarrayCodec  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_jobs import jobs_started  # noqa: E402

ROWS = 60


def opencv_on_pillow():
    """The few ``cv2`` names Petastorm's CompressedImageCodec uses, on Pillow (BGR in and out, as OpenCV)."""
    from PIL import Image

    def imencode(ext, image, _params=()):
        buf = io.BytesIO()
        Image.fromarray(image[:, :, ::-1] if image.ndim == 3 else image).save(buf, format=ext.lstrip(".").upper())
        return True, np.frombuffer(buf.getvalue(), np.uint8)

    def imdecode(buf, _flags):
        image = np.asarray(Image.open(io.BytesIO(buf.tobytes())))
        return image[:, :, ::-1] if image.ndim == 3 else image

    return types.SimpleNamespace(imencode=imencode, imdecode=imdecode, IMREAD_UNCHANGED=-1, IMWRITE_JPEG_QUALITY=1)


@pytest.fixture
def petastorm_opencv(monkeypatch):
    """Petastorm's codecs with the stand-in OpenCV, for this test only (nothing else sees a ``cv2``)."""
    import petastorm.codecs as codecs

    monkeypatch.setattr(codecs, "cv2", opencv_on_pillow(), raising=False)
    monkeypatch.setattr(codecs, "OPENCV_AVAILABLE", True)


class ReversedBytes:
    """A codec of the user's own (not Petastorm's): spark_dist cannot know how to decode it."""

    def encode(self, field, value):
        return bytearray(bytes(value)[::-1])

    def decode(self, field, value):
        return bytes(value)[::-1]

    def spark_dtype(self):
        from pyspark.sql.types import BinaryType

        return BinaryType()

    def __str__(self):
        return "ReversedBytes()"


class MyNdarrayCodec(NdarrayCodec):
    """A subclass of one of Petastorm's codecs: it may decode otherwise, so it is refused as well."""


def original(i):
    """Row ``i`` as the user has it before Petastorm encodes it."""
    rng = np.random.default_rng(i)
    return {"id": np.int32(i), "image": rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
            "mask": rng.integers(0, 256, (8, 6), dtype=np.uint8), "m": rng.random((2, 3)).astype(np.float32),
            "v": np.arange(i % 5, dtype=np.int16) * np.int16(i), "x": np.float64(i) / 3, "s": f"row {i}",
            "flag": np.bool_(i % 3 == 0)}


def write_petastorm_dataset(spark, path, extra_fields=()):
    """A Petastorm dataset as its docs write one: a Unischema with codecs, ``dict_to_spark_row``,
    ``materialize_dataset`` (with its own row-group summary job, run in Spark's Python workers)."""
    from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import BooleanType, DoubleType, IntegerType, StringType

    schema = Unischema("Example", [
        UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png"), False),
        UnischemaField("mask", np.uint8, (8, 6), CompressedImageCodec("png"), False),
        UnischemaField("m", np.float32, (2, 3), NdarrayCodec(), False),
        UnischemaField("v", np.int16, (None,), CompressedNdarrayCodec(), False),
        UnischemaField("x", np.float64, (), ScalarCodec(DoubleType()), False),
        UnischemaField("s", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("flag", np.bool_, (), ScalarCodec(BooleanType()), False),
        *extra_fields])
    extra = {f.name: np.arange(3, dtype=np.uint8) for f in extra_fields}
    rows = [dict_to_spark_row(schema, {**original(i), **extra}) for i in range(ROWS)]
    url = "file://" + str(path)
    with materialize_dataset(spark, url, schema, 1):
        spark.createDataFrame(rows, schema.as_spark_schema()).repartition(3).write.parquet(url)
    return url


def every_rank_reads(name, **options):
    """Each rank's rows of dataset ``name`` through get_context().loader, gathered: [{id: {column: value}}]."""
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    rows = {}
    for batch in ctx.loader(name, batch_size=8, drop_last=False, **options):
        for k, i in enumerate(batch["id"].tolist()):
            rows[i] = {c: (v[k].numpy() if isinstance(v, torch.Tensor) or isinstance(v[k], torch.Tensor) else v[k])
                       for c, v in batch.items()}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, rows)
    dist.destroy_process_group()
    return everyone


# -- a converter of the user's ---------------------------------------------------------------------------------
def test_a_users_converter_is_read_as_it_is_by_a_run_and_left_to_the_user(spark_local, tmp_path):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark_local.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    try:
        df = spark_local.range(0, 90, numPartitions=3).select(
            "id", F.array(F.col("id").cast("double"), F.lit(2.0)).alias("x"), (F.col("id") % 3).alias("label"))
        converter = make_spark_converter(df)
        made = sorted(os.listdir(tmp_path))
        handle = prepare_datasets(spark_local, {"train": converter}, num_ranks=2)["train"]
        assert handle.cache_dir_url == converter.cache_dir_url and handle.num_rows == 90
        assert sorted(local_path(u) for u in handle.file_urls) == sorted(local_path(u) for u in converter.file_urls)
        assert sum(map(sum, handle.row_group_rows)) == 90
        assert [(c.name, c.kind, c.dtype) for c in handle.columns] == [
            ("id", "scalar", "int64"), ("x", "array", "float32"), ("label", "scalar", "int64")]
        assert handle.column("x").length == 2

        per_rank = Distributor(num_processes=2, verbose=False).run(every_rank_reads, "train",
                                                                  datasets={"train": converter})
        ours = {i: row for rows in per_rank for i, row in rows.items()}
        with converter.make_torch_dataloader(batch_size=16, num_epochs=1) as loader:
            theirs = {i: (x, label) for batch in loader
                      for i, x, label in zip(batch["id"].tolist(), batch["x"].numpy(), batch["label"].tolist())}
        assert set(ours) == set(theirs) == set(range(90))
        assert all(np.array_equal(ours[i]["x"], theirs[i][0]) and ours[i]["label"] == theirs[i][1] for i in ours)

        assert sorted(os.listdir(tmp_path)) == made   # nothing written beside the user's cache
        clear_cache(spark_local)
        assert os.path.isdir(local_path(converter.cache_dir_url))   # the user's: never deleted by spark_dist
        converter.delete()
        with pytest.raises(DatasetError, match="dataset 'train': the Petastorm converter's cache .* was deleted"):
            prepare_datasets(spark_local, {"train": converter}, num_ranks=2)
    finally:
        spark_local.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


# -- a Petastorm dataset with a Unischema and codecs ----------------------------------------------------------
def test_a_petastorm_dataset_decodes_in_a_run_as_make_reader_reads_it(spark_local, tmp_path, petastorm_opencv):
    from petastorm import make_reader

    url = write_petastorm_dataset(spark_local, tmp_path / "examples")
    before = jobs_started(spark_local)
    handle = prepare_datasets(spark_local, {"train": url}, num_ranks=2)["train"]
    assert jobs_started(spark_local) - before <= 2   # the values' checks: one aggregation (AQE may make it 2 jobs)
    assert handle.cache_dir_url == url and handle.num_rows == ROWS and len(handle.file_urls) == 3
    assert [(c.name, c.kind) for c in handle.columns] == [
        ("id", "scalar"), ("image", "binary"), ("mask", "binary"), ("m", "binary"), ("v", "binary"),
        ("x", "scalar"), ("s", "string"), ("flag", "scalar")]
    assert (handle.column("image").codec, handle.column("image").shape) == ("image", (8, 6, 3))
    assert (handle.column("v").codec, handle.column("v").shape) == ("compressed_ndarray", None)
    before = jobs_started(spark_local)
    assert prepare_datasets(spark_local, {"again": url + "/"}, num_ranks=2)["again"].file_urls == handle.file_urls
    assert jobs_started(spark_local) == before   # described once per application

    per_rank = Distributor(num_processes=2, verbose=False).run(every_rank_reads, "train", dtypes={"x": "float64"},
                                                              datasets={"train": url})
    ours = {i: row for rows in per_rank for i, row in rows.items()}
    with make_reader(url, reader_pool_type="dummy", num_epochs=1) as reader:
        theirs = {int(row.id): row._asdict() for row in reader}
    assert set(ours) == set(theirs) == set(range(ROWS))
    for i, row in theirs.items():
        for column in ("image", "mask", "m", "v"):   # decoded by the codec: shape and dtype as Petastorm's
            mine = ours[i][column]
            assert mine.dtype == row[column].dtype and mine.shape == row[column].shape, (i, column)
            assert np.array_equal(mine, row[column]) and np.array_equal(mine, original(i)[column]), (i, column)
        assert ours[i]["x"] == row["x"] and ours[i]["s"] == row["s"] and ours[i]["id"] == row["id"]
        assert ours[i]["flag"] == row["flag"] == original(i)["flag"]
        # Scalar fields are plain columns, with the loader's dtypes (as a DataFrame's), not the Unischema's:
        assert (row["id"].dtype, row["x"].dtype, row["flag"].dtype) == (np.int32, np.float64, np.bool_)
        assert (ours[i]["id"].dtype, ours[i]["x"].dtype, ours[i]["flag"].dtype) == (np.int64, np.float64, np.bool_)
    assert ours[7]["image"].shape == (8, 6, 3) and ours[7]["v"].shape == (2,)


def test_what_cannot_be_read_is_refused_before_any_job_naming_the_dataset(spark_local, tmp_path, petastorm_opencv):
    from petastorm.unischema import UnischemaField

    plain = tmp_path / "plain"
    spark_local.range(10).write.parquet(str(plain))
    before = jobs_started(spark_local)
    with pytest.raises(DatasetError, match=r"dataset 'train': file://.*plain holds no Petastorm metadata .*"
                                           r"spark\.read\.parquet"):
        prepare_datasets(spark_local, {"train": f"file://{plain}"}, num_ranks=2)
    with pytest.raises(DatasetError, match="dataset 'missing': .* is not a directory"):
        prepare_datasets(spark_local, {"missing": str(tmp_path / "nowhere")}, num_ranks=2)
    assert jobs_started(spark_local) == before

    for codec, label in ((ReversedBytes(), "ReversedBytes"), (MyNdarrayCodec(), "MyNdarrayCodec")):
        url = write_petastorm_dataset(spark_local, tmp_path / label,
                                      [UnischemaField("raw", np.uint8, (None,), codec, False)])
        before = jobs_started(spark_local)
        with pytest.raises(DatasetError, match=f"dataset 'odd': field 'raw' uses the codec .*{label}, which "
                                               "spark_dist cannot decode"):
            Distributor(num_processes=2, verbose=False).run(every_rank_reads, "odd", datasets={"odd": url})
        assert jobs_started(spark_local) == before   # no job, no rank
