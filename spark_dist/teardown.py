"""A rank keeps every torch.distributed process group it destroys referenced until the process exits.

torch (2.13 here) can hang a rank at the end of training. DDP's reducer holds its process group; once
``destroy_process_group()`` has dropped torch's own references, freeing the reducer (the training function
returns) runs the gloo group's destructor, which joins gloo's worker threads *while holding the GIL*. A
worker thread that is still releasing its last collective (a tensor Python also saw, or a future's callback)
needs the GIL to do so: neither thread moves, and the rank never exits. gdb showed exactly that in hung ranks
here (``~ProcessGroupGloo`` joining ``pt_gloo_runloop``, which waits in ``take_gil``), about one run in five
to eight under load. A rank ends with ``os._exit`` (see :mod:`spark_dist.worker`), which frees nothing, so a
group kept referenced here never reaches that destructor; its sockets and threads go with the process. (A rank
that creates and destroys many groups holds them all until it ends: two gloo threads and a few sockets each.)
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import List

_C10D = "torch.distributed.distributed_c10d"
_kept: List[object] = []  # the destroyed process groups, never freed before the rank's os._exit


def keep_process_groups_until_exit() -> None:
    """Make ``torch.distributed.destroy_process_group`` keep the groups it destroys referenced: now if
    torch.distributed is imported, else as soon as it is (a spawned rank imports torch in the user's code)."""
    c10d = sys.modules.get(_C10D)
    if c10d is not None:
        _wrap(c10d)
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


def _wrap(c10d) -> None:
    original = c10d.destroy_process_group
    if getattr(original, "_spark_dist_keeps_groups", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group=None):
        _kept.extend(_groups_destroyed_by(c10d, group))
        return original(group)

    destroy_process_group._spark_dist_keeps_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group


def _groups_destroyed_by(c10d, group) -> list:
    """Every group when ``group`` is the default one (torch destroys them all then), else ``group``."""
    world = c10d.GroupMember.WORLD
    if group is None or group == world:
        groups = getattr(getattr(c10d, "_world", None), "pg_map", None)  # private: fall back to the default
        return list(groups) if groups else [world]
    return [group]


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps ``destroy_process_group`` right after ``distributed_c10d`` runs, before ``torch.distributed``
    re-exports it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _C10D:
            return None
        sys.meta_path.remove(self)  # once; and the other finders find the module itself
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap  # this module's own loader instance
        return spec
