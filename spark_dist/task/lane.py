"""The task side of a lane (see :mod:`spark_dist.wire.lanes`): one barrier task that serves run after run.

Each run is served exactly as a run's own barrier task serves it (:func:`~spark_dist.task.barrier_task.serve_task`:
its ranks forked from this warm Python worker, supervised, their records collected); the records go back
through the lane's store instead of the job's rows. The task returns when the driver closes the lane, when the
lane's store is gone (the driver dropped it), or after posting a :class:`~spark_dist.wire.lanes.LaneFailure`.
"""
from __future__ import annotations

import dataclasses
import sys
import traceback
from typing import Iterator

from ..wire.lanes import LaneFailure, LaneSpec, records_key, run_key, started_key
from ..wire.sealed_store import SealedStore, join_store
from ..wire.sealing import lane_run_secret
from .barrier_task import serve_task
from .child_process import fork_child
from .partition import task_slots

IDLE_WAIT_S = 3600.0  # one wait for the next run; the loop waits on until the lane closes or its store is gone


def run_lane_partition(lane: LaneSpec, batches) -> Iterator:
    """``mapInArrow`` function of a lane's barrier stage: serve each run posted to the lane, in order, until
    the lane closes; returns no batch (the runs' records travel through the lane's store).

    Raises:
        RuntimeError: the task holds fewer GPUs than ranks to run (the stage fails, naming the task).
    """
    from pyspark import BarrierTaskContext

    for _ in batches:  # the input rows only made the tasks
        pass
    context = BarrierTaskContext.get()
    slots = task_slots(context, lane)
    partition = context.partitionId()
    store = SealedStore(join_store(lane.store_host, lane.store_port, lane.join_timeout), lane.secret, lane.prefix)
    # Sealed: a peer can neither mark a task started (ending the lane) nor hide a start it cannot name. One task
    # of a partition runs at a time in a barrier stage, so the read and the write need no atomic add.
    starts = store.lookup(started_key(partition), 0) + 1
    store.put(started_key(partition), starts)
    if starts > 1:
        # Spark retried the lane's stage (a task of it failed): the run it served is lost with the first
        # attempt, and the driver replaces a lane that ended; this attempt ends at once.
        sys.stderr.write(f"spark_dist: lane {lane.lane_id} task {partition} started again: the lane ends\n")
        return iter(())
    _serve_runs(lane, store, slots, partition)
    return iter(())


def _serve_runs(lane: LaneSpec, store: SealedStore, slots, partition: int) -> None:
    number = 0
    while True:
        try:
            spec = store.wait_for(run_key(number), IDLE_WAIT_S)
        except TimeoutError:
            continue
        except Exception:  # noqa: BLE001 -- the lane's store is gone: the driver is done with this lane
            return
        if spec is None:
            return
        # The run's secret never travels through the lane: each side derives it from the lane's.
        spec = dataclasses.replace(spec, secret=lane_run_secret(lane.secret, spec.run_id, spec.attempt))
        try:
            records = list(serve_task(spec, slots, fork_child, in_executor=True))
        except Exception as exc:  # noqa: BLE001 -- said to the driver, which ends the lane
            sys.stderr.write(f"spark_dist: lane {lane.lane_id} task {partition} could not serve run "
                             f"{spec.run_id}:\n{traceback.format_exc()}")
            records = [LaneFailure(partition, f"{type(exc).__name__}: {exc}")]
        try:
            store.put(records_key(number, partition), records)
        except Exception:  # noqa: BLE001 -- the store is gone: the driver stopped waiting for this lane
            return
        if any(isinstance(r, LaneFailure) for r in records):
            return
        number += 1
