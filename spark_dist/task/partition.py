"""The Spark side of a task: the function of the run's barrier stage, ``mapInArrow(run_partition,
RECORDS_SCHEMA, barrier=True)`` on a classic session and under Spark Connect alike.

Its tasks are the Python workers the session's SQL UDFs use (the SQL runner's environment, one pool per
executor): a model's ``pandas_udf`` after a fit runs where the training imported torch. Each task reads its
process slots from the barrier context, serves them (:func:`~spark_dist.task.barrier_task.serve_task`) and
yields its records as one Arrow batch of pickles. Where the store lives is the one difference: already up
(the driver hosts it on a classic session), or hosted by the first task (Spark Connect), whose hosting code the
driver passes in (``host_store``), so this layer never imports the driver's.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Iterable, Iterator, List, Optional

from ..spark.session import records_batch
from ..wire.protocol import LaunchSpec, TaskOutcome, TaskStatus
from ..wire.ranks import TaskInfo
from .barrier_task import serve_task
from .child_process import fork_child

# (spec with the store's host, serve) -> the first task's records: hosts the store, runs the coordinator
HostStore = Callable[[LaunchSpec, Callable[[], List[Any]]], List[Any]]


def run_partition(spec: LaunchSpec, host_store: Optional[HostStore], batches) -> Iterator[Any]:
    """``mapInArrow`` function of the barrier stage: serve this task's ranks; yield their records
    (:class:`~spark_dist.wire.protocol.ResultChunk` from rank 0, a :class:`~spark_dist.wire.protocol.TaskStatus`
    per slot; under Connect the first task's :class:`~spark_dist.driver.first_task.FirstTaskReport` too) as one batch.

    ``host_store``: ``None`` when ``spec`` names a store already up; else the first task calls it to host the
    store on its executor's host (every task reads that host from ``getTaskInfos``, no barrier sync).
    A batch per record: the JVM then holds one result chunk's Arrow buffers at a time, not the whole result's.

    Raises:
        RuntimeError: the task holds fewer GPUs than ranks to run; what ``host_store`` raises; with the store
            on the driver, whatever keeps this task from serving (the stage then fails, naming the task).
    """
    from pyspark import BarrierTaskContext

    for _ in batches:  # the input rows only made the tasks
        pass
    context = BarrierTaskContext.get()
    slots = task_slots(context, spec)
    records: Iterable[Any]
    if host_store is None:
        records = serve_task(spec, slots, fork_child, in_executor=True)  # streamed as the ranks end
    else:
        spec = dataclasses.replace(spec, store_host=context.getTaskInfos()[0].address.rsplit(":", 1)[0])
        if context.partitionId() == 0:
            records = host_store(spec, lambda: list(serve_task(spec, slots, fork_child, in_executor=True)))
        else:
            records = _serve_beside_first_task(spec, slots, context.partitionId())
    for record in records:
        yield records_batch([record])


def _serve_beside_first_task(spec: LaunchSpec, slots: List[TaskInfo], index: int) -> List[Any]:
    try:
        return list(serve_task(spec, slots, fork_child, in_executor=True))
    except Exception as exc:  # noqa: BLE001 -- the first task's store unreachable from here
        # Failing the stage would throw away what the first task saw (it names the tasks that never came as
        # the rendezvous timeout); end this task and let its verdict speak.
        sys.stderr.write(f"spark_dist: task {index} could not serve its ranks through the store at "
                         f"{spec.store_host}:{spec.store_port}: {exc!r}\n")
        return [TaskStatus(slot.task_index, TaskOutcome.ABORTED) for slot in slots]


def task_slots(task_context, spec: LaunchSpec) -> List[TaskInfo]:
    """The process slots of this barrier task: one, or one per GPU when the task holds several
    (``spec.processes_per_task``). ``getTaskInfos()`` is static scheduling information: unlike ``allGather``
    it costs no barrier sync. Its address is the executor's ``host:port``, which tells the ranks that share an
    executor Spark reports lost.

    Raises:
        RuntimeError: the task holds fewer GPUs than the ranks it runs.
    """
    from ..spark.resources import task_gpu_addresses

    partition = task_context.partitionId()
    executor = task_context.getTaskInfos()[partition].address
    host = executor.rsplit(":", 1)[0]
    gpus = tuple(task_gpu_addresses(task_context)) if spec.use_gpu else ()
    k, stage = spec.processes_per_task, task_context.stageId()
    if k == 1:
        return [TaskInfo(partition, host, gpus, executor, partition, stage)]
    if len(gpus) < k:
        raise RuntimeError(f"spark_dist: this task holds GPUs {list(gpus)} but runs {k} ranks, one per GPU "
                           "(spark.task.resource.gpu.amount): check the executors' GPU discovery script")
    return [TaskInfo(partition * k + j, host, (gpus[j],), executor, partition, stage) for j in range(k)]
