"""The protocol between the driver (``driver/coordinator.py``) and its tasks (``task/barrier_task.py``), in one place.

One attempt speaks through the attempt's sealed store (see :mod:`spark_dist.wire.sealed_store`), hosted by the driver
(under Spark Connect by the first task, which also runs the coordinator: "the driver" below), under these keys,
each below the attempt's prefix (:attr:`LaunchSpec.prefix`) and a random part derived from its secret, which
nothing displays; every value but the ``arrived`` counter is sealed (encrypted and authenticated):

==========================  =====================  ============================================================
key                         written by             holds
==========================  =====================  ============================================================
``task/<index>``            each task              its slots' :class:`~spark_dist.wire.ranks.TaskInfo` (where they run)
``arrived``                 each task              an unsealed counter, bumped after ``task/<index>``: a hint for
                                                   when to read the tasks (read once, all at once)
``assignment/<index>``      the driver             the slot's :class:`SlotAssignment` (``None``: the rendezvous
                                                   was aborted); each task waits on its own key
``abort``                   anyone                 an :class:`Abort` reason: every supervisor stops its rank
``reports`` (log)           ranks                  ``ctx.report`` records (dicts), see :mod:`spark_dist.wire.store_log`
``output`` (log)            supervisors            ``(rank, [(stream, line), ...])``: the lines a rank printed
``failures`` (log)          supervisors            each failed rank's :class:`~spark_dist.errors.RankFailure`
``progress``                rank 0                 ``(epoch, step, steps, steps_per_second)`` of its loader,
                                                   overwritten: the driver's bar shows the latest
``stack/<rank>``            a supervisor           the rank's Python stack, dumped when the run timed out
``beat/<rank>``             a supervisor           ``(beat, steps)`` every second: its next number (1, 2, ...),
                                                   only one above the last read counting as a sign of life,
                                                   and the rank's step count (spark_dist.task.steps)
``stacks``                  the driver             a stall's number (1, 2, ...): every supervisor dumps its
                                                   rank's stack into ``stall_stack/<rank>`` for it
``stall_stack/<rank>``      a supervisor           ``(stall number, the rank's Python stack)``
``clock/<rank>``            a supervisor           the rank's clock as it ended (spark_dist.task.steps.FIELDS)
``ended/<rank>``            a supervisor           ``True`` once the rank has ended (after ``clock/<rank>``)
``succeeded``               the driver             ``True`` once every rank has ended without a failure,
                                                   ``False`` once the run failed or was aborted
``resize``                  the driver             why the run should stop at its next checkpoint and go on
                                                   in a new attempt (an executor under a rank is being
                                                   decommissioned; an elastic run's missing slots are free):
                                                   rank 0 reads it at each checkpoint (``RunResized``)
==========================  =====================  ============================================================

The logs are the only channel whose volume depends on the user's code, and the driver deletes what it has
read; every other key holds one small value per task or rank. The one unsealed counter (``arrived``) is a
hint: a forged value costs at most one extra read, never a loop over its size. A value that does not open
counts as absent.

Each task's Spark records (what the barrier stage's ``collect()`` returns, one pickle a row) are
:class:`ResultChunk` and :class:`TaskStatus`.
"Task" in these keys and records means a process slot, one rank: a Spark task holding k GPUs serves k of them
(:attr:`LaunchSpec.processes_per_task`), numbered ``spark_task * k + position``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .ranks import RankInfo

ABORT = "abort"
ARRIVED = "arrived"
REPORTS = "reports"
OUTPUT = "output"
FAILURES = "failures"
PROGRESS = "progress"
RUN_SUCCEEDED = "succeeded"
RESIZE = "resize"
STACKS_WANTED = "stacks"
HEARTBEAT_S = 1.0  # each rank's supervisor writes its next sealed beat/<rank> number this often
REPORT_KEYS = ("rank", "attempt", "time")  # what every ``reports`` record carries besides the user's metrics
LOG_KEY = "_log"  # a ``reports`` record holding a log_to_driver message, not metrics
INPUT_STATS_KEY = "_input_stats"  # a ``reports`` record holding a rank's input statistics, not metrics
NO_STACK = "(no stack: "  # how a ``stack`` value starts when the rank could not give one, then why, then ")"
STOPPED = "the process is stopped"  # the why, for a rank stopped by SIGSTOP or a debugger
PREEMPTED = "preempted: "  # how the ``resize`` reason for a decommissioned executor starts (ctx.preempted reads it)


def task_key(task_index: int) -> str:
    return f"task/{task_index}"


def assignment_key(task_index: int) -> str:
    return f"assignment/{task_index}"


def ended_key(rank: int) -> str:
    return f"ended/{rank}"


def stack_key(rank: int) -> str:
    return f"stack/{rank}"


def beat_key(rank: int) -> str:
    return f"beat/{rank}"


def clock_key(rank: int) -> str:
    return f"clock/{rank}"


def stall_stack_key(rank: int) -> str:
    return f"stall_stack/{rank}"


class Abort(str, enum.Enum):
    """Why a run was aborted (the value of the ``abort`` key). A supervisor dumps its rank's stack before
    killing it only on :attr:`TIMEOUT`."""

    TIMEOUT = "timeout"
    RENDEZVOUS_TIMEOUT = "rendezvous timeout"
    HOST_LOST = "host lost"
    RANK_FAILED = "a rank failed"
    JOB_FAILED = "the Spark job failed"
    STALLED = "stalled"  # spark.dist.stallAction=fail: the diagnosis (with every rank's stack) is the driver's
    CANCELLED = "cancelled on the driver"
    ENDED = "the attempt ended"  # set as its store is dropped: wakes the abort watches still waiting


class TaskOutcome(str, enum.Enum):
    """How a task's rank ended, as its supervisor saw it."""

    OK = "ok"              # the rank returned (or exited 0); rank 0's result chunks precede this status
    ABORTED = "aborted"    # the run's abort stopped it before it failed by itself
    FAILED = "failed"      # it failed and wrote a failure report


@dataclass(frozen=True)
class ResultChunk:
    """A piece of a rank's pickled result (a large result travels in several): rank 0's, or with
    ``LaunchSpec.every_result`` every rank's."""

    task_index: int
    chunk_no: int
    data: bytes = field(repr=False)
    rank: int = 0


@dataclass(frozen=True)
class TaskStatus:
    """The last record of every task."""

    task_index: int
    outcome: TaskOutcome


@dataclass(frozen=True)
class Job:
    """What a rank runs: a function with its arguments, or a script with its argv."""

    fn: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    script_path: Optional[str] = None
    script_source: Optional[bytes] = None
    script_args: Tuple[str, ...] = ()
    # DeepspeedTorchDistributor's run (see spark_dist/task/deepspeed_args.py): the ranks get "--deepspeed" and,
    # with a config, "--deepspeed_config FILE" (sys.argv), and a function ctx.deepspeed_config.
    deepspeed: bool = False
    deepspeed_config_path: Optional[str] = None  # the path the user gave, used where it exists
    deepspeed_config_text: Optional[str] = None  # the config itself (a dict's JSON, or the file as the driver read it)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a task needs to serve a rank in one attempt. Travels inside the Spark closure."""

    run_id: str
    attempt: int
    store_host: str
    store_port: int
    job_bytes: bytes = field(repr=False)
    secret: bytes = field(repr=False)
    use_gpu: bool = False
    rendezvous_timeout: float = 300.0
    checkpoint_dir: Optional[str] = None
    datasets: Dict[str, Any] = field(default_factory=dict)
    collective_timeout: Optional[float] = None
    backend: str = "ddp"
    max_result_bytes: int = 0  # spark.driver.maxResultSize (0: no bound)
    processes_per_task: int = 1  # ranks each Spark task runs (one per GPU of a multi-GPU task)
    relay_output: str = "all"  # whose printed lines the driver reads: "all", "rank0" or "none" (log_ranks)
    # Whether the ranks' bytes also go to the executor's own streams, its log. Not on a local master, where
    # those streams are the driver's console: the relay alone decides what shows there, each line once.
    executor_log: bool = True
    every_result: bool = False  # every rank's return comes back (spark_dist.distributed), not rank 0's alone
    # checkpoint_dir is the run's own default (a name under each host's private temp dir, see checkpoint_dirs):
    # each host removes its copy once the run succeeded. Never set for a given dir or a named run_id.
    remove_checkpoint_dir: bool = False
    # The run's num_processes (an elastic run's attempt may have fewer ranks), the last attempt's ranks (0: none),
    # and whether rank 0 stops at a checkpoint when the driver asks (the ``resize`` key: a preemption, a grow).
    initial_world_size: int = 0
    previous_world_size: int = 0
    watch_resize: bool = False
    # spark.dist.hostLostTimeout (0: local mode): a supervisor whose beats have not reached the store for longer
    # stops its rank (task/fence.py): the driver goes on without its host.
    host_lost_timeout: float = 0.0

    @property
    def prefix(self) -> str:
        return f"spark_dist/{self.run_id}/{self.attempt}"


@dataclass(frozen=True)
class SlotAssignment:
    """The driver's answer to one process slot (``assignment/<task_index>``): its rank and environment."""

    rank: RankInfo
    env: Dict[str, str]
