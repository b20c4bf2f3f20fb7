"""Process sets: subsets of ranks that run collectives among themselves (``hvd.ProcessSet``), each backed by
torch.distributed groups made with ``new_group``.

Invariants:

* Every registered set (the global one included) has two gloo groups over the same ranks: ``group`` for the
  collectives a script calls, and ``grad_group`` for DistributedOptimizer's gradient reductions only. Ops on
  one torch group pair up across ranks by call order (torch.distributed has no names to match by, as Horovod
  does), so gradients that one rank reduces from a backward hook and another from ``synchronize()`` must never
  interleave with a script's own collectives: on their own group they cannot.
* ``new_group`` is collective over *all* ranks, members or not, and must run in the same order everywhere; so
  are ``hvd.init(process_sets=...)``, ``add_process_set`` and ``remove_process_set`` in Horovod, which every
  rank must call alike. The id of a set is then the same on every rank.
* Ids follow Horovod's table: 0 is the global set, new sets take a freed id first (oldest freed first), else the
  next unused one.
* Removed sets' torch groups stay registered with torch until the process ends: destroying a gloo group while
  peers run can hang or abort a rank (see :mod:`spark_dist.task.teardown`).
"""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Sequence, Tuple, Union

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
_UNKNOWN_SET = "Process set does not exist or has not been registered."


class ProcessSet:
    """A set of ranks that run collectives together: pass it to ``hvd.init(process_sets=[...])`` or
    ``hvd.add_process_set``, then as ``process_set=`` to any collective. ``process_set_id`` is set once it is
    registered.

    Raises:
        ValueError: ``ranks_or_comm`` is neither a sequence of int ranks nor an MPI communicator; or it is an
            MPI communicator (there is no MPI here, as in a Horovod built without it).
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], object]):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:  # not iterable: Horovod takes it for an mpi4py communicator
            raise ValueError("Apparently you tried to build a ProcessSet from an MPI communicator, but Horovod has "
                             "not been built with MPI support (spark_dist's horovod.torch runs on torch.distributed "
                             "over gloo); install horovod 0.28.1 with MPI for it") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set; ``None`` if it is not registered.

        Raises:
            ValueError: Horovod is not initialized, or the set's id is not (or no longer) registered.
        """
        if self.process_set_id is None:
            return None
        return len(_registered(self.process_set_id).ranks)

    def rank(self) -> Optional[int]:
        """This process's rank within the set (its index in the sorted ranks; collectives such as
        ``broadcast`` still take *global* ranks); ``None`` if the set is not registered.

        Raises:
            ValueError: not initialized, the set is unknown, or this process is not in it.
        """
        if self.process_set_id is None:
            return None
        members = _registered(self.process_set_id)
        if members.rank is None:
            raise ValueError("Process is not part of provided process set.")
        return members.rank

    def included(self) -> Optional[bool]:
        """Whether this process is in the set (``None`` for a set with no ranks known).

        Raises:
            ValueError: Horovod is not initialized.
        """
        if self.ranks is None:
            return None
        return my_rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


class _Members:
    """A registered set as collectives need it: its sorted global ranks, this process's index among them (None
    when not a member) and its two torch groups (``None`` stands for torch's default group)."""

    def __init__(self, ranks: Sequence[int], my_rank: int, group, grad_group):
        self.ranks: Tuple[int, ...] = tuple(ranks)
        self.rank: Optional[int] = self.ranks.index(my_rank) if my_rank in self.ranks else None
        self.size = len(self.ranks)
        self.group = group
        self.grad_group = grad_group


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_table: Dict[int, _Members] = {}
_free_ids: collections.deque = collections.deque()
_next_id = 1
_dynamic = False  # whether add/remove_process_set are allowed after init (Horovod's dynamic process sets)


def members(process_set: ProcessSet) -> _Members:
    """The registered set behind ``process_set``, for a collective this process takes part in.

    Raises:
        ValueError: not initialized, the set is not registered, or this process is not one of its ranks.
    """
    members_ = _registered(getattr(process_set, "process_set_id", None))
    if members_.rank is None:
        raise ValueError(f"this process (rank {my_rank()}) is not part of {process_set}: only its ranks may call "
                         "collectives on it")
    return members_


def _registered(process_set_id) -> _Members:
    if not _table:
        raise ValueError(_NOT_INITIALIZED)
    try:
        return _table[process_set_id]
    except (KeyError, TypeError):
        raise ValueError(_UNKNOWN_SET) from None


def my_rank() -> int:
    """This process's global rank (its index in the global set).

    Raises:
        ValueError: not initialized.
    """
    if not _table:
        raise ValueError(_NOT_INITIALIZED)
    return _table[0].rank


def _gloo_groups(ranks: Sequence[int]):
    import torch.distributed as dist

    return dist.new_group(ranks=list(ranks), backend="gloo"), dist.new_group(ranks=list(ranks), backend="gloo")


def _take_id() -> int:
    global _next_id
    if _free_ids:
        return _free_ids.popleft()
    _next_id += 1
    return _next_id - 1


def _register_at_init(size: int, my_rank: int, group, grad_group, process_sets, dynamic: bool) -> None:
    """Fill the table at ``hvd.init()``: the global set (id 0, ``group``/``grad_group``) and ``process_sets``
    in order, Horovod's way: a duplicate (same ranks as an earlier set or the global one) is an error."""
    global _next_id, _dynamic
    _table.clear()
    _free_ids.clear()
    _next_id = 1
    _dynamic = dynamic
    global_process_set.ranks = list(range(size))
    _table[0] = _Members(range(size), my_rank, group, grad_group)
    seen = {tuple(range(size))}
    for index, ps in enumerate(process_sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets entry number {index} is not a ProcessSet: {ps!r}")
        _check_ranks(ps.ranks, size)
        if tuple(ps.ranks) in seen:
            ps._invalidate()
            raise ValueError(f"Horovod could not be initialized because process_sets entry number {index} is a "
                             f"duplicate: {ps}")
        seen.add(tuple(ps.ranks))
        ps.process_set_id = _take_id()
        _table[ps.process_set_id] = _Members(ps.ranks, my_rank, *_gloo_groups(ps.ranks))


def _adopt(process_sets) -> None:
    """A second ``hvd.init()``: give each of ``process_sets`` the id of the registered set with its ranks.

    Raises:
        ValueError: one matches no registered set.
    """
    for ps in process_sets:
        found = [i for i, m in _table.items() if i != 0 and m.ranks == tuple(ps.ranks)]
        if not found:
            raise ValueError(f"hvd.init() ran before without {ps}: register it with hvd.add_process_set")
        ps.process_set_id = found[0]


def _clear() -> None:
    """Forget every set (``hvd.shutdown()``); the ProcessSet objects keep their ids, which no longer resolve."""
    _table.clear()
    _free_ids.clear()


def _check_ranks(ranks: List[int], size: int) -> None:
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= size:
        raise ValueError(f"a process set needs distinct ranks in 0..{size - 1}, got {ranks}")


def _check_dynamic(call: str) -> None:
    if not _table:
        raise ValueError(_NOT_INITIALIZED)
    import os

    if not (_dynamic or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1"):
        raise ValueError(f"Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow {call} process sets after Horovod "
                         "initialization.")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a new process set after ``hvd.init()`` and return it. Every rank must call it, in the same order
    (it creates torch.distributed groups, which is collective over all ranks).

    Raises:
        ValueError: not initialized; neither ``hvd.init(process_sets="dynamic")`` nor
            ``HOROVOD_DYNAMIC_PROCESS_SETS=1``; a set with the same ranks exists; ranks out of range.
    """
    _check_dynamic("adding")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    size = len(_table[0].ranks)
    _check_ranks(process_set.ranks, size)
    if any(m.ranks == tuple(process_set.ranks) for m in _table.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    group, grad_group = _gloo_groups(process_set.ranks)
    process_set.process_set_id = _take_id()
    _table[process_set.process_set_id] = _Members(process_set.ranks, my_rank(), group, grad_group)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank must call it) and invalidate it; ``False`` for the global set or a
    set that is not registered, as in Horovod.

    Raises:
        ValueError: not initialized, or dynamic process sets are not enabled.
    """
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    _check_dynamic("removing")
    if _table.pop(process_set_id, None) is None:
        return False
    _free_ids.append(process_set_id)
    return True
