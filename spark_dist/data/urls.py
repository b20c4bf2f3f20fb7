"""The contract's URLs: how either side names and opens the files a :class:`~.handle.DatasetHandle` lists.

The driver writes URLs in Spark's (Hadoop's) spelling; the ranks open them with pyarrow. These three functions
are the one translation between the two, used by the driver to refuse a cache the ranks could not open (before
any write) and by the ranks to open it. No Spark here.
"""
from typing import Optional
from urllib.parse import unquote, urlparse

from ..errors import DatasetError


def local_path(url: str) -> Optional[str]:
    """The local path of a ``file:`` URL (or of a plain path); ``None`` for other filesystems."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else url
    return None


# Spark's (Hadoop's) names for filesystems pyarrow reads under another name.
_PYARROW_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
PYARROW_READS = ("file", "hdfs", "viewfs", "s3", "gs", "abfs", "abfss", "dbfs")


def readable_url(url: str) -> str:
    """``url`` as the ranks open it with pyarrow: ``dbfs:/x`` is the ``/dbfs/x`` mount (Databricks),
    ``s3a://`` and ``s3n://`` are pyarrow's ``s3://``, ``gcs://`` its ``gs://``.

    Raises:
        DatasetError: a scheme pyarrow cannot read (the write would succeed and every rank then fail).
    """
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return url
    if scheme == "dbfs":
        return "file:///dbfs/" + (parsed.netloc + parsed.path).lstrip("/")
    if scheme not in PYARROW_READS and scheme not in _PYARROW_SCHEMES:
        raise DatasetError(f"the dataset cache URL {url} has the scheme {scheme}:, which the ranks' reader "
                           f"(pyarrow) cannot open; set petastorm.spark.converter.parentCacheDirUrl to one of "
                           f"{', '.join(s + ':' for s in PYARROW_READS + tuple(_PYARROW_SCHEMES))} or a mounted path")
    return parsed._replace(scheme=_PYARROW_SCHEMES.get(scheme, scheme)).geturl()


def open_parquet(url: str):
    """A ``pyarrow.parquet.ParquetFile`` for ``url``: memory-mapped when local, through pyarrow.fs otherwise."""
    import pyarrow.parquet as pq

    url = readable_url(url)
    path = local_path(url)
    if path is not None:
        # Memory mapping skips a copy of every page into Python-owned buffers; the cache files are immutable.
        return pq.ParquetFile(path, memory_map=True)
    from pyarrow import fs as pafs

    filesystem, fs_path = pafs.FileSystem.from_uri(url)
    return pq.ParquetFile(filesystem.open_input_file(fs_path))


__all__ = ["local_path", "readable_url", "open_parquet", "PYARROW_READS"]
