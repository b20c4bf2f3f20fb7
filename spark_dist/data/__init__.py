"""Datasets for training: DataFrame -> Petastorm cache on the driver; equal shards as torch batches on ranks.

Driver: :func:`prepare_datasets` (and :func:`clear_cache`), in :mod:`.cache`; they need Spark and are
imported on first use, so a rank process (no Spark there) imports only the loader's modules (:mod:`.factory`,
:mod:`.loader`, :mod:`.handle`).
Rank: :func:`make_loader`.
"""
from .factory import make_loader
from .handle import ColumnInfo, ColumnStats, DatasetError, DatasetHandle
from .loader import ShardLoader

__all__ = ["ColumnInfo", "ColumnStats", "DatasetError", "DatasetHandle", "ShardLoader", "make_loader",
           "prepare_datasets", "clear_cache", "CACHE_DIR_CONF"]

_DRIVER_NAMES = {"prepare_datasets", "clear_cache", "CACHE_DIR_CONF"}


def __getattr__(name):  # PEP 562: the driver-side names, importing pyspark only when asked for
    if name in _DRIVER_NAMES:
        from . import cache

        return getattr(cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
