"""Which modules travel by value when spark_dist pickles user code and objects (a training function for the
ranks, a saved model for later sessions): those executors or a later session could not import by name."""
from __future__ import annotations

import sys
import threading
import types
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator


def _is_local(module) -> bool:
    """A module imported from a file that is not an installed package (a test file, a helper module next to
    a notebook): another process may not find it by name. spark_dist and torch are always installed."""
    name = getattr(module, "__name__", "")
    path = getattr(module, "__file__", None) or ""
    return bool(module is not None and name != "__main__" and path
                and "site-packages" not in path and "dist-packages" not in path
                and not path.startswith(sys.base_prefix) and name.split(".")[0] not in ("spark_dist", "torch"))


def local_modules(objects: Iterable[Any]) -> Iterator[Any]:
    """The not-installed modules defining these objects or their classes (and, for a torch module, those
    of its submodules), each once; and the not-installed modules those use (a module, a function or a class of
    another of the user's files that one imported): a function pickled by value takes the globals it names
    along, and one from a module left by reference would not be found where that module is not importable."""
    seen, found = set(), []
    for obj in objects:
        # torch as far as it is imported: another thread may be importing it right now (an object that is an
        # nn.Module was made once torch was whole).
        module_type = getattr(getattr(sys.modules.get("torch"), "nn", None), "Module", None)
        parts = list(obj.modules()) if isinstance(module_type, type) and isinstance(obj, module_type) else [obj]
        for part in parts:
            for owner in (type(part), part):
                _add(sys.modules.get(getattr(owner, "__module__", None) or ""), seen, found)
    for module in found:  # grows as it goes: what each local module uses, until no new one comes
        for value in list(vars(module).values()):
            owner = value if callable(value) else type(value)  # a function or class, else what it is made of
            used = value if isinstance(value, types.ModuleType) else sys.modules.get(
                getattr(owner, "__module__", None) or "")
            _add(used, seen, found)
    yield from found


def _add(module, seen: set, found: list) -> None:
    name = getattr(module, "__name__", "")
    if name not in seen and _is_local(module):
        seen.add(name)
        found.append(module)


# Runs started from threads pickle at once, and cloudpickle's registry is global: a module stays registered
# while any of them needs it, and one the user registered stays theirs.
_LOCK = threading.Lock()
_HOLDERS: Dict[str, int] = {}


@contextmanager
def by_value(objects: Iterable[Any]):
    """While inside, cloudpickle pickles the local modules of ``objects`` by value (installed ones stay by
    reference)."""
    import cloudpickle

    held = []
    with _LOCK:
        for module in local_modules(objects):
            name = module.__name__
            if name not in _HOLDERS:
                if name in cloudpickle.list_registry_pickle_by_value():
                    continue  # the user's own registration
                try:
                    cloudpickle.register_pickle_by_value(module)
                except ValueError:  # not importable by its name: pickled by value anyway
                    continue
            _HOLDERS[name] = _HOLDERS.get(name, 0) + 1
            held.append(module)
    try:
        yield
    finally:
        with _LOCK:
            for module in held:
                _HOLDERS[module.__name__] -= 1
                if not _HOLDERS[module.__name__]:
                    del _HOLDERS[module.__name__]
                    cloudpickle.unregister_pickle_by_value(module)


__all__ = ["by_value", "local_modules"]
