"""Run a function on a module right after it is first imported, before anything imports names from it.

A meta path finder that asks the other finders for the module's own spec and hands it back with a loader that
calls the function once the module has run. Used where spark_dist must adjust a third-party module in place:
Petastorm on new pyarrow and numpy (:mod:`spark_dist.data.prepare.petastorm_compat`), torch's process group teardown
in ranks (:mod:`spark_dist.task.teardown`).
"""
import importlib.abc
import sys
from typing import Any, Callable, Dict, List, Optional


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Insert into ``sys.meta_path``: every module whose name ``wants`` accepts gets ``patch(module)`` right
    after it runs (and ``before(module)``, when given, right before it runs). ``wants`` is asked only for
    modules not yet imported."""

    def __init__(self, wants: Callable[[str], bool], patch: Callable[[Any], None],
                 before: Optional[Callable[[Any], None]] = None):
        self._wants = wants
        self._patch = patch
        self._before = before

    def find_spec(self, name, path, target=None):
        if not self._wants(name):
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _PatchingLoader(spec.loader, self._patch, self._before)
                    return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch: Callable[[Any], None], before: Optional[Callable[[Any], None]] = None):
        self._loader = loader
        self._patch = patch
        self._before = before

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if self._before is not None:
            self._before(module)
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # is_package, get_source, resource readers: the real loader's
        return getattr(self._loader, name)


_waiting: Dict[str, List[Callable[[Any], None]]] = {}  # module name -> what runs on it once it is imported
_finder: Optional[PatchOnImport] = None  # one finder for them all: two for one module would ask each other


def when_imported(name: str, fn: Callable[[Any], None]) -> None:
    """Run ``fn(module)`` on module ``name``: now if it is imported, else right after it first runs."""
    global _finder
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    _waiting.setdefault(name, []).append(fn)
    if _finder is None:
        _finder = PatchOnImport(lambda wanted: wanted in _waiting, _run_waiting)
        sys.meta_path.insert(0, _finder)


def _run_waiting(module) -> None:
    for fn in _waiting.pop(module.__name__, []):
        fn(module)
