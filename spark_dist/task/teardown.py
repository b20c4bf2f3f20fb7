"""A rank keeps every torch.distributed process group it destroys referenced until the process exits.

torch can hang a rank at the end of training. DDP's reducer holds its process group; once
``destroy_process_group()`` has dropped torch's own references, freeing the reducer (the training function
returns) runs the gloo group's destructor, which joins gloo's worker threads *while holding the GIL*. A
worker thread that is still releasing its last collective (a tensor Python also saw, or a future's callback)
needs the GIL to do so: neither thread moves, and the rank never exits (a hung rank's stack:
``~ProcessGroupGloo`` joining ``pt_gloo_runloop``, which waits in ``take_gil``). It is a race: how often it
hits depends on load and on what the worker had imported (see BENCHMARKS.md, Spark ML). A rank ends with
``os._exit`` (see :mod:`spark_dist.task.barrier_task`), which frees nothing, so a group kept referenced here
never reaches that destructor; its sockets and threads go with the process. (A rank that creates and destroys
many groups holds them all until it ends: each gloo group its threads, two by default, and a socket per peer.)
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, List

from ..host.import_hooks import when_imported

_C10D = "torch.distributed.distributed_c10d"
_kept: List[object] = []  # the process groups destroyed here, never freed before the rank's os._exit
_before_destroy: List[Callable[[], None]] = []  # run first by every destroy_process_group in this rank
_hooked = False


def keep_process_groups_until_exit() -> None:
    """Make ``torch.distributed.destroy_process_group`` keep the groups it destroys referenced: now if
    torch.distributed is imported, else as soon as it is (a spawned rank imports torch in the user's code).

    Not covered: code that bound ``destroy_process_group`` by name before this ran, and groups dropped by
    ``_abort_process_group`` or ``shrink_group`` (NCCL's own paths). A kept group keeps its store too: a rank
    that destroys a group whose store it hosts on a fixed ``tcp://`` port cannot host a new one on that port
    (``init_process_group()`` under spark_dist joins the driver's store instead, so it is not affected)."""
    global _hooked
    c10d = sys.modules.get(_C10D)
    if c10d is not None:
        _wrap(c10d)
    elif not _hooked:  # wrapped right after distributed_c10d runs, before torch.distributed re-exports it
        when_imported(_C10D, _wrap)
        _hooked = True


def before_destroy(fn: Callable[[], None]) -> None:
    """Run ``fn`` at the start of each ``destroy_process_group`` in this rank (once wrapped): an asynchronous
    checkpoint save in flight finishes over its group before the groups go."""
    if fn not in _before_destroy:
        _before_destroy.append(fn)


def _wrap(c10d) -> None:
    original = getattr(c10d, "destroy_process_group", None)
    if original is None or getattr(original, "_spark_dist_keeps_groups", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group=None):
        for fn in list(_before_destroy):
            fn()
        _kept.extend(_groups_destroyed_by(c10d, group))
        return original(group)

    destroy_process_group._spark_dist_keeps_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group


def _groups_destroyed_by(c10d, group) -> list:
    """The live groups ``destroy_process_group(group)`` will destroy: all of them for the default group (or
    ``None``), else ``group``; nothing for a group torch does not know (it raises, or returns)."""
    live = getattr(getattr(c10d, "_world", None), "pg_map", None)  # private: without it, trust the argument
    world = c10d.GroupMember.WORLD
    if group is None or group is world:
        candidates = list(live) if live else [world]
    else:
        candidates = [group]
    return [g for g in candidates
            if g is not None and g is not c10d.GroupMember.NON_GROUP_MEMBER and (live is None or g in live)]
