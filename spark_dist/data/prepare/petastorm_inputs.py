"""What Petastorm users already have, taken as ``datasets=`` values (the driver side): their converter, and the URL
of a Petastorm dataset.

- A ``petastorm.spark.SparkDatasetConverter`` (``make_spark_converter(df)``): its cache files are read as they
  are. Nothing is written, and spark_dist never deletes them: they are the user's (``converter.delete()``).
- A Petastorm dataset written with a Unischema (``materialize_dataset`` and ``dict_to_spark_row``), passed as its
  URL, a ``str`` (a path without a scheme is a ``file://`` one): read as it is. The columns its codecs wrote
  (``CompressedImageCodec``, ``NdarrayCodec``, ``CompressedNdarrayCodec``) are decoded by the ranks
  (:mod:`spark_dist.data.read.petastorm_codecs`) in the dtype the codec stored, as Petastorm's reader decodes
  them; a ``ScalarCodec`` field (or one without a codec) is a plain Parquet column, read as any other: float32 /
  int64 / bool unless ``dtypes=`` says otherwise, as a DataFrame's column (not the field's numpy dtype, which
  ``make_reader`` keeps), so a model reads a Petastorm dataset and a DataFrame alike.

Both are described like a cache spark_dist wrote (:mod:`.pipeline`): row groups and value types from the files'
footers, column kinds from the schema, the values measured by one aggregation job (nulls, array lengths). What
:func:`source` checks needs no Spark job (the Unischema, its codecs, the files, their schema from one footer), so a
dataset that cannot be read is refused before any job of the call, and so before any rank starts.
"""
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple
from urllib.parse import urlparse

import numpy as np

from ...spark import session
from ..codecs import COMPRESSED_NDARRAY, IMAGE, NDARRAY, image_decoder
from ..handle import BINARY, DatasetError
from ..schema import column_kinds
from ..urls import local_path, open_parquet, readable_url
from . import unischema_pickle

_CONVERTER_MODULE = "petastorm.spark.spark_dataset_converter"
UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"  # where materialize_dataset keeps the pickled Unischema
# Petastorm's codecs (petastorm.codecs) and what a rank decodes each to; None: the column holds the value itself.
KNOWN_CODECS = {"CompressedImageCodec": IMAGE, "NdarrayCodec": NDARRAY, "CompressedNdarrayCodec": COMPRESSED_NDARRAY,
                "ScalarCodec": None}


@dataclass
class Source:
    """A dataset read as it is: ``url`` (the directory), ``file_urls`` (its Parquet files), ``df`` (a DataFrame
    reading them, for the checks' aggregation and the registry's key), ``kinds`` (column -> kind), ``key`` (the
    registry's slot for a cache's parent dir: never a real one, so a DataFrame's lookup never finds this entry),
    ``converter`` (the user's, or ``None``), ``codecs`` (column -> the fields of its
    :class:`~spark_dist.data.handle.CodecColumn`, which :func:`~spark_dist.data.handle.describe_files` makes).
    Plain data: the driver's path (:mod:`.pipeline`) reads it and never calls back here."""

    url: str
    file_urls: Tuple[str, ...]
    df: Any
    kinds: Dict[str, str]
    key: str
    converter: Any = None
    codecs: Dict[str, dict] = field(default_factory=dict)


def accepts(value) -> bool:
    """Whether ``value`` is a Petastorm input :func:`source` takes: a converter, or a dataset's URL."""
    return isinstance(value, (str, os.PathLike)) or _is_converter(value)


def _is_converter(value) -> bool:
    module = sys.modules.get(_CONVERTER_MODULE)  # not imported: no converter can exist in this process
    return module is not None and isinstance(value, module.SparkDatasetConverter)


def source(spark, name: str, value) -> Source:
    """The :class:`Source` of a converter or a Petastorm dataset URL, checked; no Spark job (but where this driver
    cannot open the files' footers: see :func:`_described_schema`).

    Raises:
        DatasetError: (naming the dataset) a converter whose cache was deleted; a URL with no Petastorm
            metadata (no ``_common_metadata`` holding a Unischema), a Unischema that does not unpickle here, a
            codec spark_dist does not know, an image codec where neither OpenCV nor Pillow is installed, no
            Parquet files, a partitioned dataset, a scheme the ranks' reader cannot open; or a column the loader
            cannot turn into a tensor (decimal, date, struct, ...).
    """
    if _is_converter(value):
        url = str(value.cache_dir_url).rstrip("/")
        directory = local_path(url)
        if directory is not None and not os.path.isdir(directory):
            raise DatasetError(f"dataset {name!r}: the Petastorm converter's cache {url} was deleted "
                               "(converter.delete()); make the converter again", name)
        files = tuple(sorted(_file_url(u) for u in value.file_urls))
        kinds, df = _described_schema(spark, name, url, files, what="the Petastorm converter's cache")
        return Source(url, files, df, kinds, key="petastorm-converter:" + url, converter=value)
    url = dataset_url(value)
    try:
        readable_url(url)
    except DatasetError:
        raise DatasetError(f"dataset {name!r}: {url} has a scheme the ranks' reader (pyarrow) cannot open; use a "
                           "file:, hdfs:, s3a:, gs:, abfs: or dbfs: URL", name) from None
    codecs = codec_columns(name, read_unischema(name, url))
    files = _data_files(spark, name, url)
    kinds, df = _described_schema(spark, name, url, files, what=f"the Petastorm dataset {url}")
    for column, spec in list(codecs.items()):
        if column not in kinds:
            del codecs[column]  # a Unischema field the files do not hold
        elif kinds[column] != BINARY:
            raise DatasetError(f"dataset {name!r}: field {column!r} of the Petastorm dataset {url} has the codec "
                               f"{spec['codec_name']}, which stores bytes, but the files hold a {kinds[column]} "
                               "column there", name, column)
    return Source(url, files, df, kinds, key="petastorm-dataset:" + url, codecs=codecs)


def dataset_url(value) -> str:
    """A dataset's URL as given, without a trailing slash; a path without a scheme as a ``file://`` URL."""
    text = os.fspath(value)
    if not urlparse(text).scheme:
        text = "file://" + os.path.abspath(text)
    while text.endswith("/") and len(urlparse(text).path) > 1:
        text = text[:-1]
    return text


def _foreign_codec(blob: bytes):
    """``(field name, codec class)`` of the first field whose codec is a class outside the allowlist, read with
    stand-ins for such classes; ``None`` when there is none, or when the pickle is not a Unischema's shape."""
    try:
        for f in unischema_pickle.loads_with_stand_ins(blob).fields.values():
            if isinstance(f.codec, unischema_pickle.Foreign):
                return f.name, f.codec.qualified
    except Exception:  # noqa: BLE001 -- whatever a crafted pickle's shape: the caller's error names the file
        pass
    return None


def read_unischema(name: str, url: str):
    """The Unischema ``materialize_dataset`` kept in the dataset's ``_common_metadata`` (as Petastorm's own
    ``get_schema`` reads it), read with pyarrow as the ranks read the files.

    The Unischema is unpickled by :mod:`.unischema_pickle`, which loads only an allowlist of exact names: the
    dataset's files may be writable by others, and a pickle can call any function it names.

    Raises:
        DatasetError: no such directory, no ``_common_metadata`` or no Unischema in it (the message says what
            to pass instead), a file that cannot be read, a codec class outside the allowlist (the user's own:
            the message names the field), any other name outside it (the message names the file and the
            name; nothing of it is loaded), or a Unischema that does not unpickle otherwise.
    """
    import pyarrow.parquet as pq

    readable = readable_url(url)
    path = local_path(readable)
    meta_url = readable.rstrip("/") + "/_common_metadata"
    try:
        if path is not None:
            if not os.path.isdir(path):
                raise DatasetError(f"dataset {name!r}: {url} is not a directory (a Petastorm dataset's URL)", name)
            meta_path = os.path.join(path, "_common_metadata")
            metadata = pq.read_metadata(meta_path).metadata if os.path.exists(meta_path) else None
        else:
            from pyarrow import fs as pafs

            filesystem, fs_path = pafs.FileSystem.from_uri(meta_url)
            metadata = None
            if filesystem.get_file_info(fs_path).type != pafs.FileType.NotFound:
                with filesystem.open_input_file(fs_path) as f:
                    metadata = pq.read_metadata(f).metadata
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any filesystem's or pyarrow's error: named with the dataset
        raise DatasetError(f"dataset {name!r}: cannot read {meta_url}: {type(exc).__name__}: {exc}", name) from exc
    blob = (metadata or {}).get(UNISCHEMA_KEY)
    if blob is None:
        raise DatasetError(
            f"dataset {name!r}: {url} holds no Petastorm metadata (no _common_metadata file with a Unischema), so it "
            "is not a dataset Petastorm's materialize_dataset wrote. For plain Parquet files pass "
            f"spark.read.parquet({url!r}) instead; for a Petastorm dataset that lost its metadata, run Petastorm's "
            "petastorm-generate-metadata.py on it first", name)
    try:
        return unischema_pickle.loads(blob)  # exact names only: a pickle can call any function it names
    except unischema_pickle.ForbiddenGlobal as forbidden:
        foreign = _foreign_codec(blob)
        if foreign is not None:  # a codec class of the user's
            raise _unknown_codec(name, *foreign) from None
        raise DatasetError(f"dataset {name!r}: {meta_url} names {forbidden.qualified}, which is not among the "
                           "classes a Unischema is made of (Petastorm's Unischema and codecs, numpy's, PySpark's "
                           "types); refused without loading it, since unpickling it could run any code. Whoever "
                           "can write that file can run code here: regenerate it, or read the dataset with "
                           f"spark.read.parquet({url!r})", name) from None
    except Exception as exc:  # noqa: BLE001 -- a broken pickle, an allowed class this process cannot import
        raise DatasetError(f"dataset {name!r}: the Unischema in {meta_url} cannot be read ({type(exc).__name__}: "
                           f"{exc}); spark_dist loads only Petastorm's, numpy's and PySpark's classes from it, and "
                           f"decodes only Petastorm's codecs ({', '.join(KNOWN_CODECS)})", name) from exc


def _unknown_codec(name: str, field_name: str, qualified: str) -> DatasetError:
    return DatasetError(
        f"dataset {name!r}: field {field_name!r} uses the codec {qualified}, which spark_dist cannot decode (it "
        f"decodes Petastorm's {', '.join(KNOWN_CODECS)}); read the dataset with spark.read.parquet(url), decode or "
        "drop that column, and pass the DataFrame", name, field_name)


def codec_columns(name: str, unischema) -> Dict[str, dict]:
    """Column -> the fields of its :class:`~spark_dist.data.handle.CodecColumn`, for each Unischema field whose codec
    writes bytes (a ``ScalarCodec`` field, or one without a codec, is read as the plain column it is).

    Raises:
        DatasetError: a codec other than Petastorm's own :data:`KNOWN_CODECS` (a subclass included: it may
            decode otherwise), or an image codec where neither OpenCV nor Pillow is installed.
    """
    out = {}
    for f in unischema.fields.values():
        if f.codec is None:
            continue
        cls = type(f.codec)
        if cls.__module__ != "petastorm.codecs" or cls.__name__ not in KNOWN_CODECS:
            raise _unknown_codec(name, f.name, f"{cls.__module__}.{cls.__qualname__}")
        codec = KNOWN_CODECS[cls.__name__]
        if codec is None:
            continue
        if codec == IMAGE and image_decoder() is None:
            raise DatasetError(f"dataset {name!r}: field {f.name!r} holds images ({_codec_name(f.codec)}), and "
                               "neither OpenCV (opencv-python) nor Pillow is installed to decode them", name, f.name)
        out[f.name] = {"codec": codec, "value_dtype": _dtype_name(f.numpy_dtype),
                       "value_shape": None if f.shape is None else tuple(f.shape), "codec_name": _codec_name(f.codec)}
    return out


def _codec_name(codec) -> str:
    try:
        return str(codec)
    except Exception:  # noqa: BLE001 -- a codec unpickled without the fields its __str__ reads
        return type(codec).__name__


def _dtype_name(numpy_dtype) -> str:
    try:
        return np.dtype(numpy_dtype).name
    except TypeError:  # Decimal and other non-numpy types
        return "object"


def _file_url(url: str) -> str:
    """``file:/x`` (as Hadoop writes a local path) as ``file:///x``; other URLs as they are."""
    return "file://" + url[len("file:"):] if url.startswith("file:/") and not url.startswith("file://") else url


def _data_files(spark, name: str, url: str) -> Tuple[str, ...]:
    """The dataset's data files (those directly under ``url`` whose names do not start with ``_`` or ``.``, the
    files Petastorm's and Spark's readers take), sorted; no Spark job.

    Raises:
        DatasetError: the directory cannot be listed, holds no data file, or is partitioned.
    """
    try:
        listed = session.list_files(spark, url)  # under Spark Connect, those of spark.read.parquet(url)
    except Exception as exc:  # noqa: BLE001 -- Spark's (Hadoop's) error: named with the dataset
        raise DatasetError(f"dataset {name!r}: cannot list {url}: {type(exc).__name__}: {exc}", name) from exc
    prefix = _file_url(url) + "/"
    files = sorted(_file_url(u) for u in listed if not u.rstrip("/").rsplit("/", 1)[-1].startswith(("_", ".")))
    directory = local_path(url)
    nested = [u[len(prefix):] for u in files if u.startswith(prefix) and "/" in u[len(prefix):]]
    if directory is not None and os.path.isdir(directory):
        nested += [e.name + "/" for e in os.scandir(directory) if e.is_dir() and "=" in e.name]
    if nested:
        raise DatasetError(f"dataset {name!r}: {url} is partitioned ({nested[0].split('/')[0]}/...), which spark_dist "
                           "does not read: the ranks read the files directly under it, and a partition column is in "
                           "the directory names only; write it without partition_by", name)
    if not files:
        raise DatasetError(f"dataset {name!r}: {url} holds no data files (directly under it)", name)
    return tuple(files)


def _described_schema(spark, name: str, url: str, files: Tuple[str, ...], what: str):
    """``(kinds, df)``: the column kinds of the files and a DataFrame reading them, with the schema of the first
    file's footer (no schema inference job); where this driver cannot open the file (a Spark Connect client
    on another machine), or PySpark does not map one of its types, Spark infers it (a small job).

    Raises:
        DatasetError: Spark cannot read the files, or a column the loader cannot turn into a tensor (the message
            says how to change it).
    """
    try:
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(open_parquet(files[0]).schema_arrow)
    except Exception:  # noqa: BLE001 -- any reason this driver cannot tell the schema: Spark's own inference
        schema = None
    try:
        df = (spark.read if schema is None else spark.read.schema(schema)).parquet(url)
    except Exception as exc:  # noqa: BLE001 -- Spark's error (a path gone, ...): named with the dataset
        raise DatasetError(f"dataset {name!r}: cannot read {what}: {type(exc).__name__}: {exc}", name) from exc
    try:
        return column_kinds(name, df), df
    except DatasetError as exc:
        raise DatasetError(f"{exc} (in {what}: read it with spark.read.parquet, change the column there, and pass "
                           "the DataFrame)", exc.dataset, exc.column) from None


__all__: List[str] = ["Source", "accepts", "source", "dataset_url", "read_unischema", "codec_columns", "KNOWN_CODECS"]
