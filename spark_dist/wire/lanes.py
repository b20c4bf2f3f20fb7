"""The protocol of a lane: a long-lived barrier job whose tasks serve one run after another (a tuning study's
trials), so that a trial costs a fork of warm ranks, not a Spark job.

The driver hosts the lane's own sealed store (its own secret, apart from every run's). Runs are numbered from
0 in the order the driver posts them; each run keeps its own store, secret, ports and prefix
(:class:`~spark_dist.wire.protocol.LaunchSpec`), so a lane only carries the specs out and the tasks' records
back:

==========================  =====================  ============================================================
key                         written by             holds
==========================  =====================  ============================================================
``run/<n>``                 the driver             run n's :class:`~spark_dist.wire.protocol.LaunchSpec`
                                                   without its secret (each task derives it from the lane's:
                                                   :func:`~spark_dist.wire.sealing.lane_run_secret`), or
                                                   ``None``: the lane is closing, every task returns
``records/<n>/<partition>`` each task              the records its slots gave for run n (what a run's barrier
                                                   task yields: result chunks, then one status per slot), or
                                                   a :class:`LaneFailure` when it could not serve the run
``started/<partition>``     each task              how many times the task started (sealed, so no peer can end
                                                   a lane with it): above 1, Spark retried the lane's stage,
                                                   whose task then ends at once (the run in flight was lost
                                                   with the first attempt)
==========================  =====================  ============================================================

The driver deletes run n's keys once it has read every task's records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class LaneSpec:
    """What every task of a lane gets (inside the Spark closure)."""

    lane_id: str
    store_host: str
    store_port: int
    secret: bytes = field(repr=False)
    use_gpu: bool = False
    processes_per_task: int = 1
    join_timeout: float = 300.0  # how long a task may take to reach the lane's store

    @property
    def prefix(self) -> str:
        return f"spark_dist/lane/{self.lane_id}"


@dataclass(frozen=True)
class LaneFailure:
    """A task could not serve a run (its store unreachable, a bug): the lane ends with it. ``partition`` is
    ``None`` when no task said it: the driver's own note that the lane's job ended before the task's records
    came."""

    partition: Optional[int]
    error: str


def run_key(number: int) -> str:
    return f"run/{number}"


def records_key(number: int, partition: int) -> str:
    return f"records/{number}/{partition}"


def started_key(partition: int) -> str:
    return f"started/{partition}"
