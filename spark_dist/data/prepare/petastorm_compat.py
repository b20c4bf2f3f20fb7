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

All of them reach Petastorm's modules only, so nothing changes for anyone else's pyarrow or numpy (a library
that tests ``hasattr(pyarrow, "hdfs")`` or tries ``import pyarrow.filesystem`` sees what pyarrow has):

- each ``petastorm.*`` module, as it is imported, gets its own ``pq``, ``np`` and ``pyarrow`` (``pa``): proxies
  that add these names and forward everything else;
- its import statements, which run while it is imported (``from pyarrow.filesystem import ...``) or later
  (inside functions), go through an ``__import__`` of its own (its ``__builtins__``, which Python consults
  for that module's code alone) that hands it the stand-in modules and the ``pyarrow`` proxy.

Nothing is put in ``sys.modules`` or on the real modules, not even for the length of an import, which
another thread could see. :func:`install` runs on ``import spark_dist``; it costs a list insert, and the
work happens when Petastorm is first imported (also by the user's own code).

Petastorm's code that runs in Spark's Python workers travels there pickled: ``materialize_dataset``'s row-group
summary job ships a closure calling ``lambda: pyarrow.localfs`` and ``pq.read_metadata``. cloudpickle would pickle
the proxies it refers to by name, so the worker would import the real ``pyarrow`` and fail (``module 'pyarrow'
has no attribute 'localfs'``). So each proxy and stand-in pickles as a call to :func:`_rebuilt`, which makes it
again in the worker (installing the hook there, so that the Petastorm modules the function imports are served
too). Only a process that unpickles Petastorm's own functions gets it; the user's session, and a worker that
never runs Petastorm, are left as they are.

Not supported (they raise, as on the new pyarrow without this module): Petastorm's legacy HDFS driver
(use a ``file://`` mount or an fsspec URL), hive-partitioned datasets (``materialize_dataset`` with
``partition_by``), and ``petastorm.tf_utils`` (TensorFlow is not part of this stack).
"""
import builtins
import importlib
import sys
import threading
import types

from ...host.import_hooks import PatchOnImport

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
        sys.meta_path.insert(0, PatchOnImport(_wants, _patch, before=_own_imports))
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
    """Decide (once) what Petastorm's modules need."""
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
        plan.update(_removed_pyarrow_names(pa))
    return plan


def _removed_pyarrow_names(pa) -> dict:
    """``{"pa": proxy, "modules": {name: stand-in}, "builtins": ...}`` for pyarrow >= 16: its removed legacy
    filesystem names, and the builtins whose ``__import__`` hands them to Petastorm's import statements."""
    from .petastorm_legacy_dataset import LocalFileSystem, hdfs_stub

    modules = {}
    try:
        import pyarrow.filesystem  # noqa: F401 -- present: leave it
    except ImportError:
        modules["pyarrow.filesystem"] = _module("pyarrow.filesystem", LocalFileSystem=LocalFileSystem,
                                                FileSystem=LocalFileSystem.__mro__[1])
    stand_ins = {"LocalFileSystem": LocalFileSystem, "localfs": LocalFileSystem(), "hdfs": hdfs_stub(),
                 "filesystem": modules.get("pyarrow.filesystem")}
    extra = {name: value for name, value in stand_ins.items() if value is not None and name not in pa.__dict__}
    if "hdfs" in extra:
        modules["pyarrow.hdfs"] = extra["hdfs"]
    if not extra and not modules:
        return {}
    return {"pa": _proxy(pa, **extra), "modules": modules, "builtins": {**builtins.__dict__, "__import__": _import}}


def _own_imports(module) -> None:
    """Before a Petastorm module runs: its import statements go through :func:`_import`."""
    if _plan and "builtins" in _plan:
        module.__builtins__ = _plan["builtins"]


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` for Petastorm's modules: the stand-in of a removed pyarrow module, and the ``pyarrow``
    proxy where the statement binds the top-level ``pyarrow``; everything else as the interpreter's own."""
    if level == 0 and (name == "pyarrow" or name.startswith("pyarrow.")):
        stand_in = _plan["modules"].get(name)
        if stand_in is not None:
            return stand_in if fromlist else _plan["pa"]
        imported = builtins.__import__(name, globals, locals, fromlist, level)
        return _plan["pa"] if imported is sys.modules["pyarrow"] else imported
    return builtins.__import__(name, globals, locals, fromlist, level)


def _patch(module) -> None:
    """Give one Petastorm module the proxies it needs in place of its ``pq``, ``np`` and ``pyarrow``: a module
    imported before spark_dist holds the real ones (one imported since has the ``pyarrow`` proxy already)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, real, key in (("pq", pq, "pq"), ("np", np, "np"), ("pyarrow", pa, "pa"), ("pa", pa, "pa")):
        if key in (_plan or {}) and module.__dict__.get(name) is real:
            setattr(module, name, _plan[key])


class _StandIn(types.ModuleType):
    """A module made here (a proxy or a stand-in). It pickles by name, as :func:`_rebuilt` (cloudpickle's own
    reducer, exact type only, would import the real module by that name in the process that unpickles it)."""

    def __reduce__(self):
        return _rebuilt, (self.__name__,)


def _rebuilt(name: str) -> types.ModuleType:
    """The stand-in for module ``name`` in this process, where a pickled Petastorm function refers to one (Spark's
    Python worker running ``materialize_dataset``'s summary job); the real module where this stack needs none."""
    install()  # the Petastorm modules that function imports are served too
    _prepare()
    plan = _plan or {}
    found = {"pyarrow": plan.get("pa"), "pyarrow.parquet": plan.get("pq"), "numpy": plan.get("np"),
             **plan.get("modules", {})}.get(name)
    return found if found is not None else importlib.import_module(name)


def _proxy(real, **extra) -> types.ModuleType:
    """A module that has ``extra`` and forwards every other attribute to ``real``."""
    proxy = _module(real.__name__, **extra)
    proxy.__getattr__ = lambda name: getattr(real, name)  # PEP 562
    proxy.__file__ = getattr(real, "__file__", None)
    return proxy


def _module(name: str, **attrs) -> types.ModuleType:
    module = _StandIn(name, f"spark_dist's stand-in for {name} (see {__name__})")
    module.__dict__.update(attrs)
    return module


__all__ = ["install", "needed"]
