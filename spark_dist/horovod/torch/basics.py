"""``hvd.init()`` and what scripts ask about the job: ranks and sizes, what this build has, barrier and join.

Rendezvous: ``init()`` joins torch.distributed's default process group over gloo with the torchrun variables
spark_dist gives every rank (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``; ``HOROVOD_RANK`` and
``HOROVOD_SIZE`` stand in for the last two), or reuses the default group when one is already initialized.
Local and cross ranks come from ``HOROVOD_LOCAL_RANK``/``_SIZE`` and ``HOROVOD_CROSS_RANK``/``_SIZE`` when all
four are set (spark_dist's Horovod backend sets them), else from the ranks' hosts as Horovod derives them.

``shutdown()`` forgets this module's state but leaves torch's groups up: a later ``init()`` reuses the default
group, and destroying gloo groups mid-run can hang a rank (see :mod:`spark_dist.task.teardown`).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Optional

from ..exceptions import HorovodInternalError
from . import negotiation
from . import process_sets as _sets
from .engine import Adasum, Average, Max, Min, Product, Sum, reset_handles, run, unsupported  # noqa: F401
from .process_sets import ProcessSet, global_process_set

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass(frozen=True)
class _World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool


_world: Optional[_World] = None
_joins = 0  # join() calls so far in this process: the same count on every rank, so it names each join's arrivals


def _env_int(*names: str) -> Optional[int]:
    """The value of the first set of ``names`` (all set ones must agree), or None."""
    values = {}
    for name in names:
        raw = os.environ.get(name, "")
        if raw:
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"hvd.init(): {name}={raw!r} is not an integer") from None
    if len(set(values.values())) > 1:
        raise ValueError("hvd.init(): " + " and ".join(f"{k}={v}" for k, v in values.items()) + " disagree")
    return next(iter(values.values()), None)


def init(comm=None, process_sets=None):
    """Join the job: every rank calls it once before any collective.

    Args:
        comm: ``None`` (all ranks), or a list of all ranks. An MPI communicator or a subset of ranks is not
            covered.
        process_sets: ``None``, a list of :class:`ProcessSet` to register now (every rank passes the same), or
            ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` later (as does
            ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

    Raises:
        ValueError: no rank, size or store address in the environment (and no default process group), values
            that disagree with the default group, a duplicate process set, or an MPI communicator as ``comm``.
        NotImplementedError: ``comm`` names a subset of the ranks.
        HorovodInternalError: joining the process group failed.
    """
    import torch.distributed as dist

    global _world
    dynamic = isinstance(process_sets, str) and process_sets.lower() == "dynamic"
    if dynamic:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # as Horovod does
    process_sets = [] if process_sets is None or dynamic else list(process_sets)
    if _world is not None:  # a second init: the job is joined already; sets must be known ones
        _check_comm(comm, _world.size)
        _sets._adopt(process_sets)
        return
    rank_, size_ = _env_int("RANK", "HOROVOD_RANK"), _env_int("WORLD_SIZE", "HOROVOD_SIZE")
    if not dist.is_initialized():
        if rank_ is None or size_ is None or not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
            raise ValueError("hvd.init() needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (HOROVOD_RANK and "
                             "HOROVOD_SIZE also do for the last two), which spark_dist and torchrun set for every "
                             "rank, or an initialized torch.distributed default process group")
        _check_comm(comm, size_)  # before joining: a communicator cannot be honoured
        run(lambda: dist.init_process_group("gloo", init_method="env://", rank=rank_, world_size=size_))
    elif (rank_, size_) not in ((None, None), (dist.get_rank(), dist.get_world_size())):
        raise ValueError(f"hvd.init(): the environment says rank {rank_} of {size_}, the initialized default "
                         f"process group rank {dist.get_rank()} of {dist.get_world_size()}")
    rank_, size_ = dist.get_rank(), dist.get_world_size()
    _check_comm(comm, size_)
    # The global set's collectives run on the default group when it has gloo (a "cpu:gloo,cuda:nccl" group
    # has), else on a gloo group of all ranks; its gradients always on a group of their own.
    group = None if "gloo" in str(dist.get_backend()) else run(lambda: dist.new_group(backend="gloo"))
    grad_group = run(lambda: dist.new_group(backend="gloo"))
    _world = _topology(rank_, size_, group)
    reset_handles()
    _sets._register_at_init(size_, rank_, group, grad_group, process_sets, dynamic)


def _check_comm(comm, size_: int) -> None:
    if comm is None:
        return
    try:
        ranks = sorted(comm)
    except TypeError:
        raise ValueError("Horovod has not been built with MPI support, so hvd.init(comm=...) takes a list of ranks "
                         "only; install horovod 0.28.1 with MPI for an MPI communicator") from None
    if ranks and ranks != list(range(size_)):
        raise unsupported(f"hvd.init(comm={ranks})", "a job of a subset of the ranks")


def _topology(rank_: int, size_: int, group) -> _World:
    """Local and cross ranks. From the environment when spark_dist's Horovod variables are all set; else as
    Horovod derives them from hosts: ranks on one node numbered by global rank, and a rank's cross peers are the
    ranks of its local rank on the other nodes. Collective: every rank gathers every rank's node."""
    import torch.distributed as dist

    env = [_env_int(n) for n in ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
                                 "HOROVOD_CROSS_SIZE")]
    node = os.environ.get("HOROVOD_HOSTNAME") or (
        f"node {os.environ['GROUP_RANK']}" if os.environ.get("GROUP_RANK") else socket.gethostname())
    nodes = [None] * size_
    run(lambda: dist.all_gather_object(nodes, node, group=group))
    homogeneous = len({nodes.count(n) for n in nodes}) == 1
    if None not in env:
        return _World(rank_, size_, *env, homogeneous=homogeneous)
    local = [[q for q in range(size_) if nodes[q] == nodes[r]].index(r) for r in range(size_)]
    cross = [q for q in range(size_) if local[q] == local[rank_]]
    return _World(rank_, size_, local[rank_], nodes.count(nodes[rank_]), cross.index(rank_), len(cross),
                  homogeneous)


def shutdown():
    """Leave Horovod: ranks and collectives raise until the next ``init()``; pending handles are dropped. The
    torch.distributed groups stay up (the next ``init()`` reuses the default one)."""
    global _world
    _world = None
    _sets._clear()
    reset_handles()


def is_initialized() -> bool:
    """Whether ``init()`` ran (and no ``shutdown()`` since)."""
    return _world is not None


def _w() -> _World:
    if _world is None:
        raise ValueError(_NOT_INITIALIZED)
    return _world


def _query(field: str, doc: str):
    """A rank or size query: ``field`` of what ``init()`` learned. Raises ValueError before ``init()``."""
    def query():
        return getattr(_w(), field)

    query.__name__ = query.__qualname__ = "is_homogeneous" if field == "homogeneous" else field
    query.__doc__ = doc + " Raises ValueError before ``init()``."
    return query


size = _query("size", "The number of processes.")
rank = _query("rank", "This process's rank, 0..size()-1.")
local_size = _query("local_size", "The number of processes on this node.")
local_rank = _query("local_rank", "This process's rank among those on its node.")
cross_size = _query("cross_size", "The number of nodes that have a process of this local rank.")
cross_rank = _query("cross_rank", "This node's index among the nodes that have a process of this local rank.")
is_homogeneous = _query("homogeneous", "Whether every node runs the same number of processes.")


def _built(name: str, value, doc: str):
    """What this build has, answered as Horovod answers it (its types: bool, and an int for NCCL)."""
    def built():
        return value

    built.__name__ = built.__qualname__ = name
    built.__doc__ = doc
    return built


mpi_enabled = _built("mpi_enabled", False, "False: no MPI here.")
mpi_built = _built("mpi_built", False, "False: no MPI here.")
gloo_built = _built("gloo_built", True, "True: collectives run over gloo.")
nccl_built = _built("nccl_built", 0, "0: no NCCL (Horovod returns its NCCL version code, or 0).")
ddl_built = _built("ddl_built", False, "False: no IBM DDL.")
ccl_built = _built("ccl_built", False, "False: no oneCCL.")
cuda_built = _built("cuda_built", False, "False: collectives take CPU tensors only here.")
rocm_built = _built("rocm_built", False, "False: no ROCm.")


def mpi_threads_supported() -> bool:
    """Raises ValueError, as Horovod without MPI does: there is no MPI here."""
    raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")


def gloo_enabled() -> bool:
    """True once ``init()`` ran: collectives run over gloo."""
    return _world is not None


def start_timeline(file_path, mark_cycles=False):
    """Raises NotImplementedError: Horovod's timeline records its own C++ core's activity."""
    raise unsupported("hvd.start_timeline()", "the timeline traces Horovod's own C++ core")


def stop_timeline():
    """Raises NotImplementedError (see ``start_timeline``)."""
    raise unsupported("hvd.stop_timeline()", "the timeline traces Horovod's own C++ core")


def barrier(process_set: ProcessSet = global_process_set):
    """Wait until every rank of ``process_set`` gets here (a rank in ``join()`` counts as here).

    Raises:
        ValueError: not initialized, or this rank is not in ``process_set``.
        HorovodInternalError: the barrier failed, or another rank issued another collective at this point
            (Horovod's "Mismatched operations").
    """
    error = negotiation.negotiate(_sets.members(process_set), negotiation.request(negotiation.BARRIER))
    if error:
        raise HorovodInternalError(error)


def join(device=-1) -> int:
    """Wait until every rank has called ``join()``; returns the rank that called it last. Meanwhile this rank
    stands in for the collectives the other ranks still issue on the global process set, as Horovod's does: it
    adds zeros to their allreduces, and their other collectives fail with Horovod's "... is not supported with
    Join at this time." (see :mod:`.negotiation`). It does not stand in for DistributedOptimizer's gradient
    reductions, nor for collectives on other process sets: ranks that issue those while another rank is in
    ``join()`` wait until torch's timeout and raise. ``device`` is accepted and unused.

    Raises:
        ValueError: not initialized.
        HorovodInternalError: a collective failed.
    """
    import torch.distributed as dist

    global _joins
    world = _w()
    _joins += 1
    # The order ranks arrive in, from the store every rank reached at init: the last one is join()'s answer.
    store, key = dist.distributed_c10d._get_default_store(), f"spark_dist.horovod/join/{_joins}"
    mine = negotiation.Request(negotiation.JOIN, arrival=run(lambda: store.add(key, 1)))
    set_ = _sets.members(global_process_set)
    while True:
        requests = negotiation.exchange(set_, mine)
        if requests is None:  # a job of one rank
            return world.rank
        if all(r.kind == negotiation.JOIN for r in requests):
            return set_.ranks[max(range(len(requests)), key=lambda i: requests[i].arrival)]
        negotiation.stand_in(set_, requests)


__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
           "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
           "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
           "stop_timeline", "barrier", "join", "HorovodInternalError", "Average", "Sum", "Adasum", "Min", "Max",
           "Product"]
