"""The legacy pyarrow pieces Petastorm 0.12.1 reads datasets with, rebuilt on ``pq.ParquetFile``.

Only what Petastorm calls (see :mod:`.petastorm_compat`, which hands these to Petastorm's modules alone):
a dataset is a sorted list of Parquet files under one directory or a list of files, one piece per file
(Petastorm splits pieces into row groups itself), the ``_common_metadata`` / ``_metadata`` summary files
when present, and no partitions.
"""
import os

import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem as _FsspecLocal


class LocalFileSystem(_FsspecLocal):
    """``pyarrow.LocalFileSystem`` as it was before pyarrow 16: fsspec's local filesystem (which pyarrow's
    readers accept) with the legacy names."""

    @classmethod
    def get_instance(cls):
        return cls()

    def delete(self, path, recursive=False):
        return self.rm(path, recursive=recursive)

    def _isfilestore(self):
        return True


def hdfs_stub():
    """``pyarrow.hdfs``, removed in pyarrow 16: says what to use instead."""
    import types

    def connect(*_args, **_kwargs):
        raise NotImplementedError(
            "pyarrow >= 16 has no legacy HDFS driver (pyarrow.hdfs), which Petastorm's hdfs:// URLs use: read "
            "the dataset through a file:// mount of HDFS, or an fsspec URL (e.g. webhdfs://), or set "
            "petastorm.spark.converter.parentCacheDirUrl to such a location")

    class HadoopFileSystem:
        def __init__(self, *args, **kwargs):
            connect()

    stub = types.ModuleType("pyarrow.hdfs", "spark_dist's stand-in for the removed pyarrow.hdfs")
    stub.connect, stub.HadoopFileSystem = connect, HadoopFileSystem
    return stub


class ParquetDatasetPiece:
    """One file (or one row group of it) of a dataset, as ``pq.ParquetDatasetPiece`` was."""

    def __init__(self, path, open_file_func=None, file_options=None, row_group=None, partition_keys=None):
        self.path = path
        self.open_file_func = open_file_func or (lambda p: open(p, "rb"))
        self.row_group = row_group
        self.partition_keys = partition_keys or []

    def open(self):
        return pq.ParquetFile(self.open_file_func(self.path))

    def get_metadata(self):
        with self.open_file_func(self.path) as f:
            return pq.ParquetFile(f).metadata

    def read(self, columns=None, use_threads=True, partitions=None, file=None, use_pandas_metadata=False):
        columns = sorted(columns) if isinstance(columns, (set, frozenset)) else columns
        with (file if file is not None else self.open_file_func(self.path)) as f:
            reader = pq.ParquetFile(f)
            if self.row_group is not None:
                return reader.read_row_group(self.row_group, columns=columns, use_threads=use_threads,
                                             use_pandas_metadata=use_pandas_metadata)
            return reader.read(columns=columns, use_threads=use_threads, use_pandas_metadata=use_pandas_metadata)

    def __repr__(self):
        return f"ParquetDatasetPiece({self.path!r}, row_group={self.row_group})"


class ParquetDataset:
    """``pq.ParquetDataset`` as it was before pyarrow 15, for reading: ``pieces``, ``paths``, ``fs``,
    ``partitions`` (always None), ``metadata`` / ``common_metadata`` (the summary files' FileMetaData).

    Raises:
        NotImplementedError: a hive-partitioned directory (``key=value`` subdirectories).
        FileNotFoundError: no such path.
    """

    def __init__(self, path_or_paths, filesystem=None, schema=None, metadata=None, split_row_groups=False,
                 validate_schema=True, filters=None, metadata_nthreads=1, **_ignored):
        self.fs = filesystem if filesystem is not None else LocalFileSystem()
        self.paths = path_or_paths
        self.partitions = None
        self.metadata_path = self.common_metadata_path = None
        if isinstance(path_or_paths, (list, tuple)):
            files = list(path_or_paths)
        elif self.fs.isdir(path_or_paths):
            files = self._list(path_or_paths)
        elif self.fs.exists(path_or_paths):
            files = [path_or_paths]
        else:
            raise FileNotFoundError(path_or_paths)
        self.pieces = [ParquetDatasetPiece(f, open_file_func=self.fs.open) for f in sorted(files)]
        self.metadata = self._summary(self.metadata_path) if metadata is None else metadata
        self.common_metadata = self._summary(self.common_metadata_path)

    def _list(self, directory):
        files = []
        for entry in self.fs.ls(directory, detail=True):
            path = entry["name"]
            base = os.path.basename(path.rstrip("/"))
            if base == "_metadata":
                self.metadata_path = path
            elif base == "_common_metadata":
                self.common_metadata_path = path
            elif entry["type"] == "directory" and "=" in base:
                raise NotImplementedError(
                    f"{directory} is partitioned ({base}); spark_dist's stand-in for pyarrow's legacy "
                    "ParquetDataset reads unpartitioned datasets only (write it without partitionBy)")
            elif entry["type"] == "file" and not base.startswith(("_", ".")):
                files.append(path)
        return files

    def _summary(self, path):
        if path is None:
            return None
        with self.fs.open(path, "rb") as f:
            return pq.read_metadata(f)


__all__ = ["LocalFileSystem", "ParquetDataset", "ParquetDatasetPiece", "hdfs_stub"]
