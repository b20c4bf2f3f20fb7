"""Which modules travel by value when spark_dist pickles user code and objects (a training function for the
ranks, a saved model for later sessions): those executors or a later session could not import by name."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator


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
    of its submodules), each once."""
    seen = set()
    for obj in objects:
        torch = sys.modules.get("torch")
        parts = list(obj.modules()) if torch is not None and isinstance(obj, torch.nn.Module) else [obj]
        for part in parts:
            for owner in (type(part), part):
                name = getattr(owner, "__module__", None) or ""
                module = sys.modules.get(name)
                if name not in seen and _is_local(module):
                    seen.add(name)
                    yield module


@contextmanager
def by_value(objects: Iterable[Any]):
    """While inside, cloudpickle pickles the local modules of ``objects`` by value (installed ones stay by
    reference)."""
    import cloudpickle

    registered = []
    for module in local_modules(objects):
        try:
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
        except ValueError:  # not importable by its name: pickled by value anyway
            pass
    try:
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


__all__ = ["by_value", "local_modules"]
