"""Who is who: rank assignment, a pure function of the tasks' hosts and GPUs, and the network interface a
rank's collectives use. The driver (or the first task, under Connect) computes it once every task has said
where it runs; each task reads back its own slots' ranks from the store.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

LAYOUTS = ("host", "task")


@dataclass(frozen=True)
class TaskInfo:
    """What one process slot knows about itself before ranks exist. A Spark task runs one slot, or one
    per GPU when it holds several (``spark.task.resource.gpu.amount`` > 1); ``task_index`` numbers the slots
    of the run (``spark_task * processes_per_task + position``), ``spark_task`` the Spark task (partition)
    that runs it (0 for every slot in local mode: the driver is one node)."""

    task_index: int
    host: str
    gpus: Tuple[str, ...] = ()  # this slot's GPU addresses
    executor: str = ""  # the executor's host:port on Spark (unique per executor); "" in local mode
    spark_task: int = -1  # -1: the same as task_index (one slot per Spark task)
    stage: int = -1  # the barrier stage's Spark id (-1 in local mode): the driver finds its executors by it

    @property
    def partition(self) -> int:
        return self.task_index if self.spark_task < 0 else self.spark_task


@dataclass(frozen=True)
class RankInfo:
    """One rank's place in the run; the torchrun variables are derived from it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    host: str
    gpus: Tuple[str, ...] = ()
    cuda_visible_devices: str = ""
    cross_rank: int = 0
    cross_size: int = 1


def assign_ranks(tasks: Sequence[TaskInfo], layout: str = "host") -> List[RankInfo]:
    """Ranks for ``tasks`` (process slots), returned in the order of ``tasks``.

    A *node* is what torchrun calls one: the slots that share ``LOCAL_RANK`` numbering and a
    ``CUDA_VISIBLE_DEVICES`` list. ``layout="host"`` makes each host a node (its slots get local ranks 0, 1,
    ... ordered by first GPU id, then slot index); ``layout="task"`` makes each Spark task a node, as PySpark's
    TorchDistributor does (``LOCAL_RANK`` 0 for a one-GPU task; 0..k-1 for a task of k GPUs). Nodes are
    numbered by their lowest slot index, so slot 0's node is node 0, and ranks run node by node. Either way
    ``CUDA_VISIBLE_DEVICES`` lists the node's GPUs in local-rank order, so ``cuda:LOCAL_RANK`` is each rank's
    own GPU. ``cross_rank`` is the node index among nodes that have that local rank (Horovod's)."""
    by_node: Dict[object, List[TaskInfo]] = {}
    for task in sorted(tasks, key=lambda t: t.task_index):
        by_node.setdefault(task.host if layout == "host" else task.partition, []).append(task)

    def gpu_key(task: TaskInfo):
        first = task.gpus[0] if task.gpus else ""
        return (0, int(first), task.task_index) if first.isdigit() else (1, first, task.task_index)

    nodes = list(by_node)  # insertion order = order of each node's lowest slot index
    world_size = len(tasks)
    result: Dict[int, RankInfo] = {}
    rank = 0
    for node_rank, node in enumerate(nodes):
        # Within a Spark task, the slots keep the order of the task's GPUs as Spark lists them (PySpark's).
        local = by_node[node] if layout == "task" else sorted(by_node[node], key=gpu_key)
        visible = visible_devices([t.gpus for t in local])
        for local_rank, task in enumerate(local):
            holders = [n for n in nodes if len(by_node[n]) > local_rank]
            result[task.task_index] = RankInfo(
                rank=rank,
                local_rank=local_rank,
                world_size=world_size,
                local_world_size=len(local),
                node_rank=node_rank,
                num_nodes=len(nodes),
                host=task.host,
                gpus=tuple(task.gpus),
                cuda_visible_devices=visible,
                cross_rank=holders.index(node),
                cross_size=len(holders),
            )
            rank += 1
    return [result[t.task_index] for t in tasks]


def interface_of(host: str) -> Optional[str]:
    """The network interface that holds ``host``'s address on this machine (``None`` if none does).

    gloo connects ranks through the address the machine's host name resolves to, which in containers is
    often 127.0.0.1: its full mesh then fails across hosts ("Connection refused, remote=[127.0.0.1]").
    Pointing ``GLOO_SOCKET_IFNAME`` at the interface of the task's Spark host address avoids that.
    """
    import psutil

    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] in wanted for a in addresses):
            return name
    return None


def with_gloo_interface(env: Dict[str, str], host: str) -> Dict[str, str]:
    """``env`` plus ``GLOO_SOCKET_IFNAME`` (torch's gloo) and ``HOROVOD_GLOO_IFACE`` naming the interface of
    the task's Spark address ``host``, unless the user chose them (see :func:`interface_of`)."""
    keys = [k for k in ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE") if k not in os.environ and k not in env]
    name = interface_of(host) if keys else None
    return {**env, **{k: name for k in keys}} if name else env


def visible_devices(gpus_in_local_rank_order: Sequence[Sequence[str]]) -> str:
    """CUDA_VISIBLE_DEVICES for a host: the GPUs Spark gave this run's tasks there, in local-rank order, so
    ``cuda:LOCAL_RANK`` is each task's own GPU (torchrun's convention, which Lightning and scripts follow)."""
    return ",".join(addr for gpus in gpus_in_local_rank_order for addr in gpus)
