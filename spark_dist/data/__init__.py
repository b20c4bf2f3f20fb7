"""Datasets for training: two rooms and the contract between them.

- The driver's room, :mod:`.prepare`: a run's ``datasets=`` values (DataFrames, Petastorm converters and dataset
  URLs, handles) -> each DataFrame written once to a checked Parquet cache -> a :class:`DatasetHandle` each
  (:func:`prepare_datasets`, :func:`clear_cache`). It needs Spark, so its names here are imported on first use.
- The rank's room, :mod:`.read`: a handle -> this rank's equal share as torch batches (:func:`make_loader`,
  :class:`ShardLoader`). No Spark there.
- The contract, these top-level modules, what travels between them and imports neither room: the handle
  (:mod:`.handle`: :class:`DatasetHandle`, :class:`ColumnInfo`, :class:`ColumnStats`), the column kinds
  (:mod:`.schema`), the URLs the ranks open (:mod:`.urls`), the Petastorm codecs a handle names (:mod:`.codecs`),
  and :class:`DatasetError`.
"""
from .handle import ColumnInfo, ColumnStats, DatasetError, DatasetHandle
from .read import ShardLoader, make_loader

__all__ = ["ColumnInfo", "ColumnStats", "DatasetError", "DatasetHandle", "ShardLoader", "make_loader",
           "prepare_datasets", "clear_cache", "CACHE_DIR_CONF"]

_DRIVER_NAMES = {"prepare_datasets", "clear_cache", "CACHE_DIR_CONF"}


def __getattr__(name):  # PEP 562: the driver's names, its room imported only when asked for
    if name in _DRIVER_NAMES:
        from . import prepare

        return getattr(prepare, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
