"""``import horovod.torch`` resolving to :mod:`spark_dist.horovod.torch`: a meta path finder at the front of
``sys.meta_path`` that hands back this package's modules under Horovod's module names (the same module objects,
so ``horovod.torch is spark_dist.horovod.torch``), and refuses the rest of Horovod (``horovod.tensorflow``,
``horovod.spark``, ``horovod.runner``...) with an error that says so.

Modules are imported when a script imports them, not when the finder is installed: installing costs no torch
import. In the style of :mod:`spark_dist.host.import_hooks`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Optional

_PACKAGE = "spark_dist.horovod"
# Horovod's module name -> the module here; None: an empty package (horovod.common holds only what is below it)
ALIASES = {
    "horovod": _PACKAGE,
    "horovod.torch": f"{_PACKAGE}.torch",
    "horovod.torch.mpi_ops": f"{_PACKAGE}.torch",  # Horovod's home of the collectives; ours exports them all
    "horovod.torch.compression": f"{_PACKAGE}.torch.compression",
    "horovod.torch.functions": f"{_PACKAGE}.torch.functions",
    "horovod.torch.optimizer": f"{_PACKAGE}.torch.optimizer",
    "horovod.torch.sync_batch_norm": f"{_PACKAGE}.torch.sync_batch_norm",
    "horovod.torch.elastic": f"{_PACKAGE}.torch.elastic",
    "horovod.torch.elastic.state": f"{_PACKAGE}.torch.elastic.state",
    "horovod.torch.elastic.sampler": f"{_PACKAGE}.torch.elastic.sampler",
    "horovod.common": None,
    "horovod.common.exceptions": f"{_PACKAGE}.exceptions",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, name: str, target: Optional[str]):
        self._name = name
        self._target = target
        self._own_spec = None

    def create_module(self, spec):
        if self._target is None:
            module = types.ModuleType(self._name, "Part of Horovod's API provided by spark_dist.horovod.")
            module.__path__ = []
            module.__spark_dist_alias__ = True
            return module
        module = importlib.import_module(self._target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system has set __spec__ to the alias's spec: the module keeps its own (reloads, pickling).
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class HorovodAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``horovod`` and the ``horovod.*`` modules of :data:`ALIASES` to this package's.

    Raises (from ``import``):
        ModuleNotFoundError: any other ``horovod.*`` module, naming it and the way to get it.
    """

    def find_spec(self, name, path, target=None):
        if name != "horovod" and not name.startswith("horovod."):
            return None
        if name not in ALIASES:
            raise ModuleNotFoundError(f"{name} is not part of spark_dist's horovod.torch implementation "
                                      f"(spark_dist.horovod), which install_as_horovod() put in Horovod's place; "
                                      f"install horovod 0.28.1 for it", name=name)
        aliased = ALIASES[name]
        is_package = aliased is None or importlib.util.find_spec(aliased).submodule_search_locations is not None
        return importlib.util.spec_from_loader(name, _AliasLoader(name, aliased), is_package=is_package)


_finder: Optional[HorovodAliasFinder] = None


def _is_ours(module) -> bool:
    name = getattr(module, "__name__", "")
    return name == _PACKAGE or name.startswith(_PACKAGE + ".") or getattr(module, "__spark_dist_alias__", False)


def horovod_installed() -> bool:
    """Whether a ``horovod`` package can be imported: one with an ``__init__.py``, not a bare folder of that name
    on ``sys.path`` (a folder of that name on a test path, say), which Python takes for a namespace
    package."""
    spec = importlib.util.find_spec("horovod")
    return spec is not None and spec.origin is not None


def install_as_horovod(force: bool = False) -> bool:
    """Make ``import horovod.torch`` (and ``horovod``, ``horovod.torch.elastic``, ``horovod.common.exceptions``)
    give this package's implementation in this process, unless Horovod is installed and ``force`` is False.

    With ``force``, Horovod modules already imported leave ``sys.modules`` (objects bound to them keep working);
    later imports get this implementation. Idempotent.

    Returns:
        True when ``horovod`` now resolves here; False when an installed Horovod was left in place.
    """
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        return True
    imported = [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]
    if not force and (imported or horovod_installed()):
        return False
    for name in imported:
        if not _is_ours(sys.modules[name]):
            del sys.modules[name]
    _finder = HorovodAliasFinder()
    sys.meta_path.insert(0, _finder)
    return True


def uninstall_horovod_alias() -> None:
    """Undo :func:`install_as_horovod`: remove the finder and the aliases from ``sys.modules`` (this package's
    modules stay imported under their own names)."""
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        if _is_ours(sys.modules[name]):
            del sys.modules[name]
