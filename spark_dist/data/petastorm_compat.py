"""Petastorm 0.12.1 on pyarrow >= 15 and numpy 2: the names they removed, supplied to Petastorm alone.

Petastorm (the last release, and what spark_dist reads its dataset caches with) was written for the old
pyarrow and numpy. On the Spark 4 line it cannot even be imported. What this module supplies, each only
when the running pyarrow or numpy lacks it:

- ``pyarrow.filesystem`` (removed in pyarrow 16; ``petastorm/utils.py`` imports it), ``pyarrow.LocalFileSystem``
  and ``pyarrow.localfs``: a local filesystem with the legacy methods, on fsspec's (which Petastorm already
  needs, and which pyarrow's own readers accept).
- ``pyarrow.hdfs`` (removed in 16): a stub whose ``connect`` says what to do instead.
- The legacy ``pq.ParquetDataset(path_or_paths, filesystem=, validate_schema=, metadata_nthreads=, filters=)``
  with ``.pieces``, ``.partitions``, ``.metadata``, ``.common_metadata``, ``.fs``, ``.paths``, and
  ``pq.ParquetDatasetPiece`` (removed in 15), on ``pq.ParquetFile``.
- ``np.unicode_`` and ``np.string_`` (removed in numpy 2), as ``np.str_`` and ``np.bytes_``.

The last two reach Petastorm's modules only: each ``petastorm.*`` module, as it is imported, gets its own
``pq`` and ``np`` (proxies that add these names and forward everything else), so nothing changes for
anyone else's pyarrow or numpy. The removed modules can only be supplied in ``sys.modules``; they are new
names there, so no existing code sees a difference. :func:`install` runs on ``import spark_dist``; it costs
a list insert, and the work happens when Petastorm is first imported (also by the user's own code).

Not supported (they raise, as on the new pyarrow without this module): Petastorm's legacy HDFS driver
(use a ``file://`` mount or an fsspec URL), hive-partitioned datasets (``materialize_dataset`` with
``partition_by``), and ``petastorm.tf_utils`` (TensorFlow is not part of this stack).
"""
import sys
import threading
import types

from ..import_hooks import PatchOnImport

_lock = threading.Lock()
_installed = False
_plan = None  # {name: value} to give Petastorm modules, decided when Petastorm is first imported


def _wants(name: str) -> bool:
    """Every ``petastorm`` module, once the patch plan is made (none on a stack that needs none)."""
    return (name == "petastorm" or name.startswith("petastorm.")) and _prepare()


def install() -> None:
    """Make Petastorm importable and working on the running pyarrow and numpy (idempotent, thread-safe).

    Does nothing on a stack that still has every name (pyarrow < 15 with numpy 1). Never raises.
    """
    global _installed
    with _lock:
        if _installed:
            return
        sys.meta_path.insert(0, PatchOnImport(_wants, _patch))
        _installed = True
    if any(name == "petastorm" or name.startswith("petastorm.") for name in sys.modules):
        if _prepare():  # imported before spark_dist: patch what is there (a later import is patched anyway)
            for name, module in list(sys.modules.items()):
                if name.startswith("petastorm") and module is not None:
                    _patch(module)


def needed() -> bool:
    """Whether the running pyarrow or numpy lacks a name Petastorm 0.12.1 uses."""
    return _prepare()


def _prepare() -> bool:
    """Decide (once) what Petastorm's modules need, and supply the removed pyarrow modules."""
    global _plan
    with _lock:
        if _plan is None:
            _plan = _make_plan()
        return bool(_plan)


def _make_plan() -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    plan = {}
    if not hasattr(pq, "ParquetDatasetPiece"):  # pyarrow >= 15
        from . import petastorm_legacy_dataset as legacy

        plan["pq"] = _proxy(pq, ParquetDataset=legacy.ParquetDataset, ParquetDatasetPiece=legacy.ParquetDatasetPiece)
    if "unicode_" not in np.__dict__ and "string_" not in np.__dict__:  # numpy 2 (its __getattr__ raises)
        plan["np"] = _proxy(np, unicode_=np.str_, string_=np.bytes_)
    if int(pa.__version__.split(".")[0]) >= 16:
        from .petastorm_legacy_dataset import LocalFileSystem, hdfs_stub

        try:
            import pyarrow.filesystem  # noqa: F401 -- present: leave it
        except ImportError:
            sys.modules["pyarrow.filesystem"] = _module("pyarrow.filesystem", LocalFileSystem=LocalFileSystem,
                                                        FileSystem=LocalFileSystem.__mro__[1])
            plan["pyarrow.filesystem"] = True
        for name, value in (("LocalFileSystem", LocalFileSystem), ("localfs", LocalFileSystem()),
                            ("hdfs", hdfs_stub())):
            if name not in pa.__dict__:
                setattr(pa, name, value)
                plan["pyarrow." + name] = True
        sys.modules.setdefault("pyarrow.hdfs", pa.hdfs)
    return plan


def _patch(module) -> None:
    """Give one Petastorm module the proxies it needs in place of its ``pq`` and ``np``."""
    import numpy as np
    import pyarrow.parquet as pq

    for name, real in (("pq", pq), ("np", np)):
        if name in (_plan or {}) and module.__dict__.get(name) is real:
            setattr(module, name, _plan[name])


def _proxy(real, **extra) -> types.ModuleType:
    """A module that has ``extra`` and forwards every other attribute to ``real``."""
    proxy = _module(real.__name__, **extra)
    proxy.__getattr__ = lambda name: getattr(real, name)  # PEP 562
    proxy.__file__ = getattr(real, "__file__", None)
    return proxy


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name, f"spark_dist's stand-in for {name} (see {__name__})")
    module.__dict__.update(attrs)
    return module


__all__ = ["install", "needed"]
