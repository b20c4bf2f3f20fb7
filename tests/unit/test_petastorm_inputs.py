"""Petastorm inputs without a JVM: the Unischema read from a dataset's metadata, its codecs judged, and the codec
columns decoded by the ranks' loader as Petastorm's own reader decodes them.

The files here are written with pyarrow, the Unischema pickled into ``_common_metadata`` as ``materialize_dataset``
does; images are PNGs as OpenCV writes them (RGB on disk). tests/spark/test_petastorm_inputs_runs.py compares
with Petastorm's readers on datasets Petastorm wrote.
"""
import io
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import spark_dist  # noqa: F401 -- before Petastorm, as a user's script
from spark_dist.data import DatasetError, make_loader
from spark_dist.data.codecs import COMPRESSED_NDARRAY, IMAGE, NDARRAY
from spark_dist.data.handle import BINARY, SCALAR, CodecColumn, describe_files
from spark_dist.data.prepare import petastorm_inputs as inputs
from spark_dist.data.read.petastorm_codecs import decode, decode_image, decoded_batch

PIL = pytest.importorskip("PIL.Image")


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    PIL.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def saved(array: np.ndarray, compressed=False) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, arr=array) if compressed else np.save(buf, array)
    return buf.getvalue()


def rgb(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (8, 6, 3), dtype=np.uint8)


# -- decoding, as Petastorm's codecs do ------------------------------------------------------------------------
def test_images_decode_as_petastorms_codec_returns_them():
    assert np.array_equal(decode_image(png(rgb(1))), rgb(1))   # RGB order, [H, W, 3], uint8
    grey = rgb(2)[:, :, 0]
    out = decode_image(png(grey))
    assert out.shape == (8, 6) and out.dtype == np.uint8 and np.array_equal(out, grey)
    deep = (np.arange(48, dtype=np.uint16).reshape(8, 6) * 1000)   # 16-bit greyscale, as OpenCV's IMREAD_UNCHANGED
    buf = io.BytesIO()
    PIL.fromarray(deep).save(buf, format="PNG")
    assert np.array_equal(decode_image(buf.getvalue()), deep) and decode_image(buf.getvalue()).dtype == np.uint16
    with pytest.raises(ValueError, match=r"supported: \(H, W\) or \(H, W, 3\)"):   # as Petastorm's codec
        decode_image(png(np.zeros((4, 4, 4), np.uint8)))
    buf = io.BytesIO()
    PIL.fromarray(rgb(3)).save(buf, format="JPEG", quality=95)
    jpeg = decode_image(buf.getvalue())
    assert jpeg.shape == (8, 6, 3) and jpeg.dtype == np.uint8


def test_ndarrays_decode_with_their_shape_and_dtype():
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    for codec, data in ((NDARRAY, saved(a)), (COMPRESSED_NDARRAY, saved(a, compressed=True))):
        out = decode(codec, data)
        assert out.dtype == np.float16 and out.shape == (3, 4) and np.array_equal(out, a)
    with pytest.raises(ValueError, match="unknown codec"):
        decode("mystery", b"")


def test_a_batch_of_a_codec_column_is_one_tensor_where_the_unischema_gives_one_shape():
    image = CodecColumn("image", BINARY, "object", codec=IMAGE, value_dtype="uint8", value_shape=(8, 6, 3),
                        codec_name="CompressedImageCodec('png', 80)")
    assert image.shape == (8, 6, 3)
    batch = decoded_batch(image, pa.array([png(rgb(i)) for i in range(4)], pa.binary()), pin=False)
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (4, 8, 6, 3)
    assert all(np.array_equal(batch["image"][i].numpy(), rgb(i)) for i in range(4))

    v = CodecColumn("v", BINARY, "object", codec=COMPRESSED_NDARRAY, value_dtype="int16", value_shape=(None,))
    assert v.shape is None
    rows = [np.arange(n, dtype=np.int16) for n in (0, 3, 1)]
    out = decoded_batch(v, pa.array([saved(r, True) for r in rows], pa.binary()), pin=False)["v"]
    assert isinstance(out, list) and [t.tolist() for t in out] == [r.tolist() for r in rows]
    assert all(t.dtype == torch.int16 for t in out)

    with pytest.raises(DatasetError, match=r"column 'image' \(CompressedImageCodec\('png', 80\)\): a row decodes to "
                                           r"shape \(4, 4, 3\), not the Unischema's \(8, 6, 3\)"):
        decoded_batch(image, pa.array([png(np.zeros((4, 4, 3), np.uint8))]), pin=False)
    with pytest.raises(DatasetError, match="column 'image' .*: a row could not be decoded"):
        decoded_batch(image, pa.array([b"not a png"]), pin=False)
    assert pickle.loads(pickle.dumps(image)) == image   # it travels to the ranks inside the handle


# -- the Unischema, read from the metadata, and its codecs judged ---------------------------------------------
class MyCodec:
    """A codec of the user's own: Petastorm's reader does not load its class, nor does spark_dist."""

    def __str__(self):
        return "MyCodec()"


@pytest.fixture
def opencv_claimed(monkeypatch):
    """Petastorm's CompressedImageCodec can be made (it asserts OpenCV is installed; it is not needed here)."""
    import petastorm.codecs as codecs

    monkeypatch.setattr(codecs, "OPENCV_AVAILABLE", True)


def unischema(*extra):
    from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    return Unischema("Example", [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png"), False),
        UnischemaField("m", np.float32, (2, 3), NdarrayCodec(), False),
        UnischemaField("v", np.int16, (None,), CompressedNdarrayCodec(), False),
        UnischemaField("plain", np.int32, (), None, False), *extra])


def write_dataset(path, rows=40, files=2, schema=None):
    """A Petastorm dataset written with pyarrow: id, image (PNG), m (np.save) and v (np.savez_compressed)."""
    os.makedirs(path, exist_ok=True)
    per = rows // files
    for f in range(files):
        ids = range(f * per, (f + 1) * per)
        table = pa.table({"id": pa.array(list(ids), pa.int64()),
                          "image": pa.array([png(rgb(i)) for i in ids], pa.binary()),
                          "m": pa.array([saved(np.full((2, 3), i, np.float32)) for i in ids], pa.binary()),
                          "v": pa.array([saved(np.arange(i % 4, dtype=np.int16), True) for i in ids], pa.binary()),
                          "plain": pa.array([i * 2 for i in ids], pa.int32())})
        pq.write_table(table, os.path.join(path, f"part-{f:05d}.parquet"), row_group_size=7)
    if schema is not None:
        pq.write_metadata(table.schema.with_metadata({inputs.UNISCHEMA_KEY: pickle.dumps(schema)}),
                          os.path.join(path, "_common_metadata"))
    return "file://" + str(path)


def test_the_unischema_and_its_codecs_are_read_from_the_metadata(tmp_path, opencv_claimed):
    url = write_dataset(tmp_path / "ds", schema=unischema())
    codecs = inputs.codec_columns("train", inputs.read_unischema("train", url))
    assert codecs == {   # a ScalarCodec field, and one without a codec, are plain columns
        "image": {"codec": IMAGE, "value_dtype": "uint8", "value_shape": (8, 6, 3),
                  "codec_name": "CompressedImageCodec('png', 80)"},
        "m": {"codec": NDARRAY, "value_dtype": "float32", "value_shape": (2, 3), "codec_name": "NdarrayCodec()"},
        "v": {"codec": COMPRESSED_NDARRAY, "value_dtype": "int16", "value_shape": (None,),
              "codec_name": "CompressedNdarrayCodec()"}}


def test_what_cannot_be_read_is_refused_naming_the_dataset(tmp_path, opencv_claimed, monkeypatch):
    from petastorm.unischema import UnischemaField

    plain = write_dataset(tmp_path / "plain")
    with pytest.raises(DatasetError, match=r"dataset 'train': file://.*plain holds no Petastorm metadata \(no "
                                           r"_common_metadata file with a Unischema\).*spark\.read\.parquet"):
        inputs.read_unischema("train", plain)
    with pytest.raises(DatasetError, match="dataset 'train': file://.*nowhere is not a directory"):
        inputs.read_unischema("train", "file://" + str(tmp_path / "nowhere"))
    theirs = write_dataset(tmp_path / "theirs", schema=unischema(UnischemaField("raw", np.uint8, (None,), MyCodec(),
                                                                               False)))
    with pytest.raises(DatasetError, match=r"dataset 'train': field 'raw' uses the codec "
                                           r"test_petastorm_inputs\.MyCodec, which spark_dist cannot decode") as info:
        inputs.read_unischema("train", theirs)
    assert (info.value.dataset, info.value.column) == ("train", "raw")
    broken = tmp_path / "broken"
    write_dataset(broken)
    pq.write_metadata(pa.schema([("id", pa.int64())]).with_metadata({inputs.UNISCHEMA_KEY: b"not a pickle"}),
                      str(broken / "_common_metadata"))
    with pytest.raises(DatasetError, match="dataset 'train': the Unischema in .*broken/_common_metadata cannot be "
                                           "read"):
        inputs.read_unischema("train", "file://" + str(broken))

    class Subclass(type(unischema().fields["m"].codec)):   # Petastorm's class name, another module or class
        pass
    odd = unischema(UnischemaField("raw", np.uint8, (None,), Subclass(), False))
    with pytest.raises(DatasetError, match="field 'raw' uses the codec .*Subclass, which spark_dist cannot decode"):
        inputs.codec_columns("train", odd)
    monkeypatch.setattr(inputs, "image_decoder", lambda: None)
    with pytest.raises(DatasetError, match="dataset 'train': field 'image' holds images .* neither OpenCV "
                                           r"\(opencv-python\) nor Pillow is installed"):
        inputs.codec_columns("train", unischema())



def test_a_unischema_naming_any_other_function_is_refused_unrun_naming_the_file(tmp_path, opencv_claimed):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    for payload in (b"cbuiltins\neval\n(" + pickle.dumps(code, protocol=0)[:-1] + b"tR.",   # Petastorm's allows it
                    b"cposix\nsystem\n(S'true'\ntR.",
                    b"cposix\nsystem\n)\x81}S'fields'\n}S'a'\nI1\nssb.",  # shaped as a Unischema with fields
                    b"cbuiltins\ngetattr\n(cbuiltins\nobject\nS'__subclasses__'\ntR."):
        url = write_dataset(tmp_path / "evil")
        pq.write_metadata(pa.schema([("id", pa.int64())]).with_metadata({inputs.UNISCHEMA_KEY: payload}),
                          str(tmp_path / "evil" / "_common_metadata"))
        with pytest.raises(DatasetError, match=r"dataset 'train': .*evil/_common_metadata names "
                                               r"(builtins\.eval|posix\.system|builtins\.getattr)") as info:
            inputs.read_unischema("train", url)
        assert info.value.dataset == "train"
        assert not marker.exists()
    legacy = pickle.dumps(unischema(), protocol=0)   # as Petastorm's former package wrote it: still read
    legacy = legacy.replace(b"cpetastorm.unischema\n", b"cav.ml.dataset_toolkit.unischema\n")
    url = write_dataset(tmp_path / "legacy")
    pq.write_metadata(pa.schema([("id", pa.int64())]).with_metadata({inputs.UNISCHEMA_KEY: legacy}),
                      str(tmp_path / "legacy" / "_common_metadata"))
    assert list(inputs.read_unischema("train", url).fields) == ["id", "image", "m", "v", "plain"]

def test_inputs_and_urls_are_recognised():
    assert inputs.accepts("file:///data/x") and inputs.accepts("relative/dir")
    assert not inputs.accepts(42) and not inputs.accepts(object())
    assert inputs.dataset_url("/data/ds/") == "file:///data/ds"
    assert inputs.dataset_url("hdfs://nn:8020/data/ds//") == "hdfs://nn:8020/data/ds"
    assert inputs.dataset_url("ds") == "file://" + os.path.abspath("ds")


# -- the ranks' loader decodes them, every column of a batch on the same rows ----------------------------------
def test_a_loader_over_a_petastorm_dataset_decodes_its_codec_columns(tmp_path, opencv_claimed):
    url = write_dataset(tmp_path / "ds", rows=40, schema=unischema())
    codecs = inputs.codec_columns("train", inputs.read_unischema("train", url))
    kinds = {"id": SCALAR, "image": BINARY, "m": BINARY, "v": BINARY, "plain": SCALAR}
    files = sorted(url + "/" + f for f in os.listdir(tmp_path / "ds") if not f.startswith("_"))
    described = describe_files("train", url, files, kinds, {})
    handle = describe_files("train", url, files, kinds, {}, codecs=codecs)
    assert handle.column("image").row_bytes == max(described.column("image").row_bytes, 8 * 6 * 3)   # decoded size
    assert handle.row_group_rows == ((7, 7, 6), (7, 7, 6)) and handle.num_rows == 40
    seen = []
    for rank in range(2):
        for batch in make_loader(handle, rank=rank, world_size=2, batch_size=6, drop_last=False, seed=3):
            assert batch["image"].shape[1:] == (8, 6, 3) and batch["image"].dtype == torch.uint8
            assert batch["m"].shape[1:] == (2, 3) and batch["m"].dtype == torch.float32
            for k, i in enumerate(batch["id"].tolist()):
                assert np.array_equal(batch["image"][k].numpy(), rgb(i))
                assert np.array_equal(batch["m"][k].numpy(), np.full((2, 3), i, np.float32))
                assert batch["v"][k].tolist() == list(range(i % 4)) and batch["plain"][k].item() == 2 * i
                seen.append(i)
    assert sorted(seen) == list(range(40))
    doubled = make_loader(handle, rank=0, world_size=1, batch_size=8, columns=["id", "image"],
                          transform=lambda b: {"id": b["id"], "bright": b["image"].float() * 2})
    first = next(iter(doubled))   # a transform gets the decoded tensors
    assert first["bright"].shape == (8, 8, 6, 3)
    assert torch.equal(first["bright"][0], torch.from_numpy(rgb(first["id"][0].item())).float() * 2)


def test_scalar_fields_come_with_the_loaders_dtypes_not_the_unischemas(tmp_path):
    # A Unischema's scalar fields are plain Parquet columns: a batch holds them as the same columns of a DataFrame
    # (float32, int64, bool; dtypes= overrides), not in the field's numpy dtype as petastorm.make_reader yields them.
    from petastorm.codecs import ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import BooleanType, ByteType, DoubleType, FloatType, IntegerType

    fields = {"i32": (np.int32, IntegerType(), pa.int32()), "i8": (np.int8, ByteType(), pa.int8()),
              "f64": (np.float64, DoubleType(), pa.float64()), "f32": (np.float32, FloatType(), pa.float32()),
              "flag": (np.bool_, BooleanType(), pa.bool_())}
    schema = Unischema("Scalars", [UnischemaField(n, t, (), ScalarCodec(s), False) for n, (t, s, _) in fields.items()])
    os.makedirs(tmp_path / "ds")
    ids = range(24)
    values = {"i32": list(ids), "i8": list(ids), "f64": [i / 3 for i in ids], "f32": [i / 4 for i in ids],
              "flag": [i % 2 == 1 for i in ids]}
    table = pa.table({n: pa.array(values[n], a) for n, (_, _, a) in fields.items()})
    pq.write_table(table, str(tmp_path / "ds" / "part-00000.parquet"))
    pq.write_metadata(table.schema.with_metadata({inputs.UNISCHEMA_KEY: pickle.dumps(schema)}),
                      str(tmp_path / "ds" / "_common_metadata"))
    url = "file://" + str(tmp_path / "ds")
    assert inputs.codec_columns("s", inputs.read_unischema("s", url)) == {}   # every field a plain column
    handle = describe_files("s", url, [url + "/part-00000.parquet"], dict.fromkeys(fields, SCALAR), {})
    batch = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=24, shuffle=False)))
    assert {n: t.dtype for n, t in batch.items()} == {"i32": torch.int64, "i8": torch.int64, "f64": torch.float32,
                                                      "f32": torch.float32, "flag": torch.bool}
    assert batch["i32"].tolist() == values["i32"] and batch["flag"].tolist() == values["flag"]
    exact = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=24, shuffle=False,
                                  dtypes={"f64": torch.float64, "i32": "int32"})))
    assert exact["f64"].dtype == torch.float64 and exact["f64"].tolist() == values["f64"]
    assert exact["i32"].dtype == torch.int32
