"""Warm imports in a reused Python worker: after a run whose ranks trained, the worker imports in the
background what a training rank imports on its first optimizer step, so that later runs fork ranks that
already hold it.

torch.optim's step imports torch._dynamo, with sympy and torch.distributed.tensor, its heaviest dependencies
(their cost: BENCHMARKS.md, Spark ML). None of them starts a thread. A rank forked from a worker
that holds torch._dynamo must not free its process groups at exit, where torch's gloo teardown can hang:
:mod:`spark_dist.task.teardown` keeps ranks out of it.

The next fork waits for the imports (:func:`warmed`): a fork while another thread holds the import lock would
leave that lock held forever in the child.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Optional

WARM_MODULES = ("torch._dynamo",)
IMPORTED_DYNAMO = "imported-torch-dynamo"  # a rank leaves this file in its work dir when it did
_warming: Optional[threading.Thread] = None
_warming_lifted = False  # a fork is waiting: the warm-up must not go (back) to the lowest priority
_warming_priority = threading.Lock()  # orders the warm-up's lowering against a fork's lifting
_LOWEST_NICE = 19


def warm_for_next_run() -> None:
    """Import :data:`WARM_MODULES` into this reused Python worker in the background after a run whose ranks
    imported torch._dynamo (they trained): the worker idles between runs, and later runs fork ranks that
    already have these modules. The next fork waits for the imports (:func:`warmed`), which its ranks would
    have spent importing the same modules themselves. Runs that do not train (no optimizer step) never start
    it. The imports run at the lowest CPU priority only where :func:`warmed` may lift it again: a thread left
    at nice 19 on a busy machine gets almost no CPU, and the fork waiting on it would wait for that."""
    global _warming
    if _warming is None and "torch" in sys.modules and any(m not in sys.modules for m in WARM_MODULES):
        _warming = threading.Thread(target=_import_all, args=(WARM_MODULES,), daemon=True,
                                    name="spark_dist-warm-imports")
        _warming.start()


def _import_all(names) -> None:
    import importlib

    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice < _LOWEST_NICE and may_lift_priority_to(nice):
        with _warming_priority:
            if not _warming_lifted:
                try:  # this thread only: other work keeps the cores while the worker idles (per-thread nice)
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _LOWEST_NICE)
                except (AttributeError, OSError):
                    pass
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- only a head start: the rank imports what it needs itself
            pass


def may_lift_priority_to(nice: int) -> bool:
    """Whether this process may set a thread's nice value back down to ``nice``: with CAP_SYS_NICE, or where
    RLIMIT_NICE allows it (its soft limit ``r`` allows nice values down to ``20 - r``)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft == resource.RLIM_INFINITY or 20 - soft <= nice:
            return True
    except (ImportError, AttributeError, OSError, ValueError):
        pass
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 23 & 1)  # bit 23: CAP_SYS_NICE
    except (OSError, ValueError, IndexError):
        pass
    return False


def warmed() -> None:
    """Wait for the background imports: a fork while another thread holds the import lock would leave it
    held forever in the child. The imports first get this thread's priority back: the fork is waiting."""
    global _warming_lifted
    if _warming is not None:
        with _warming_priority:
            _warming_lifted = True
            if _warming.is_alive():  # the caller's own nice: a no-op where the warm-up never lowered it
                try:
                    os.setpriority(os.PRIO_PROCESS, _warming.native_id, os.getpriority(os.PRIO_PROCESS, 0))
                except OSError:  # the thread ended meanwhile, or the limits changed: the join still waits
                    pass
        _warming.join()
