"""Elastic runs (``min_processes`` below ``num_processes``): how many ranks each attempt gets, and when a
running attempt should grow back.

Invariants:

- an attempt's size is a multiple of the ranks per task, from ``min_processes`` to ``num_processes``;
- what the cluster can give is Spark's own count. The first attempt counts the slots of the executors
  registered (as Spark's barrier check does); a retry counts the slots free now, because a task of the failed
  attempt on a host that went silent stays running in Spark's books until Spark declares its executor lost
  (after ``spark.network.timeout``): a retry never asks for a lost host's slots, and sees them again once
  Spark has the task back or the executor replaced;
- a retry that finds ``min_processes`` ranks' slots starts on them once the count has stood still for
  ``still`` seconds (the failed attempt's own tasks on the hosts left have ended), or after ``settle`` seconds,
  without waiting out ``spark.dist.retrySlotWaitTimeout`` for the lost ones;
- under Spark Connect the client has no count of free slots: a retry runs without the ranks the last attempt
  lost, and grows back only at a later retry (no grow check while it runs);
- a running attempt stops to grow once the missing ranks' slots have stayed free for its ``grow_wait``: none
  at first; after a grow whose next attempt still got fewer than ``num_processes`` ranks (the slots were
  taken again first), :data:`GROW_BACKOFF_S`, doubled after each further one; after
  ``spark.dist.maxShortGrows`` such grows, never (the run goes on at its size);
- a preemption is ours when a decommissioned executor runs one of our tasks, by executor id where the status
  store says which executor runs each task, by host only where it cannot say.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable, List, Optional, Sequence, Set

from ..config import CONF_MAX_PREEMPTIONS, CONF_MAX_SHORT_GROWS, CONF_MIN_PROCESSES, CONF_RETRY_SLOT_WAIT, RunConfig
from ..errors import ConfigError, RankFailure
from ..spark import session
from ..wire.protocol import PREEMPTED
from ..wire.ranks import TaskInfo

log = logging.getLogger("spark_dist")
_RECHECK_S = 0.25
STILL_S = 2.0  # a free-slot count that stood still this long has settled (the failed attempt's tasks ended)
GROW_BACKOFF_S = 30.0  # the missing slots' free time a grow needs after one that fell short; doubled each time


def stop_of(failures: List[RankFailure]) -> Optional[RankFailure]:
    """Rank 0's stop at a checkpoint (a ``"resized"`` record) among an attempt's failures, else ``None``."""
    return next((f for f in failures if f.kind == "resized"), None)


def is_preemption(stop: Optional[RankFailure]) -> bool:
    """Whether rank 0 stopped because an executor under a rank is being decommissioned (not for a grow)."""
    return stop is not None and stop.message.startswith(PREEMPTED)


def ranks_lost(failures: List[RankFailure]) -> int:
    """How many ranks the attempt lost with their task, executor or host (not those that raised); a lost task
    whose rank is unknown (under Spark Connect Spark names only the barrier task) counts as one."""
    lost = [f for f in failures if f.kind == "lost"]
    return len({f.rank for f in lost if f.rank is not None}) + sum(f.rank is None for f in lost)


def retry_size(config: RunConfig, spark, previous_size: int, failures: List[RankFailure], wait: float,
               settle: float, still: float = STILL_S, free_slots: Optional[Callable[[], Optional[int]]] = None) -> int:
    """The ranks of the next attempt of an elastic run: ``num_processes`` when their slots are free, else as many
    as are free if at least ``min_processes``, once the count has settled (stood still for ``still`` seconds, or
    ``settle`` seconds passed), waiting up to ``wait`` seconds for that.

    Raises:
        ConfigError: fewer than ``min_processes`` ranks' slots were free after ``wait`` seconds, naming
            ``spark.dist.minProcesses`` and ``spark.dist.retrySlotWaitTimeout``.
    """
    full, per_task = config.num_processes, config.processes_per_task
    free_slots = free_slots or (lambda: session.free_task_slots(spark))
    started = changed = time.monotonic()
    last = None
    while True:
        free = free_slots()
        if free is None:  # Spark Connect: the last attempt's size without the ranks it lost
            lost = ranks_lost(failures)
            size = previous_size - -(-lost // per_task) * per_task if lost else full
            return max(size, config.min_processes)
        now = time.monotonic()
        if free != last:
            last, changed = free, now
        size = min(full, free * per_task)
        # Settled: the count stood still for a while (the failed attempt's tasks have ended), or settle is up.
        settled = now - changed >= min(still, settle) or now - started >= settle
        if size == full or (size >= config.min_processes and settled):
            return size
        waited = now - started
        if waited >= wait:
            raise ConfigError(
                f"the cluster had slots for {size} ranks, fewer than min_processes={config.min_processes} "
                f"({CONF_MIN_PROCESSES}), after waiting {wait:g}s ({CONF_RETRY_SLOT_WAIT}) for lost executors")
        time.sleep(_RECHECK_S)


def first_size(config: RunConfig, spark, wait: float) -> int:
    """The ranks of an elastic run's first attempt: ``num_processes`` once the cluster has their slots, else
    after ``wait`` seconds (``spark.dist.slotWaitTimeout``; none on a ``local[N]`` master) as many as it has if
    at least ``min_processes``; ``num_processes`` where the count is unknown (Spark Connect without the conf
    that tells it).

    Raises:
        ConfigError: the cluster has slots for fewer than ``min_processes`` ranks after ``wait`` seconds.
    """
    full, per_task = config.num_processes, config.processes_per_task
    deadline = time.monotonic() + (0 if session.is_local_master(spark) else wait)
    while True:
        slots = session.task_slots(spark)
        if slots is None:
            return full
        size = min(full, slots * per_task)
        if size == full:
            return full
        if time.monotonic() >= deadline:
            if size >= config.min_processes:
                return size
            raise ConfigError(
                f"num_processes={full} with min_processes={config.min_processes}, but the cluster has slots for "
                f"{size} ranks (master {session.master(spark)}): lower min_processes ({CONF_MIN_PROCESSES}), "
                "add executors or cores, or raise spark.dist.slotWaitTimeout if executors are still starting")
        time.sleep(_RECHECK_S)


def watch(config: RunConfig, spark, full: int) -> Optional[Callable[[Sequence[TaskInfo]], Optional[str]]]:
    """What the driver checks while an attempt runs on a classic session (``config``: the attempt's, its
    ``num_processes`` the attempt's ranks; ``full``: the run's ``num_processes``), ``None`` where it can check
    nothing (local mode, Spark Connect): given where the attempt's tasks run, why it should stop at its next
    checkpoint, else ``None``. Two reasons, in this order: an executor running a rank is being decommissioned
    (every run: ``PREEMPTED`` and the executors; see :func:`_ours`), or, for an elastic run's attempt below
    ``full``, the slots of the missing ranks have stayed free for the attempt's ``grow_wait`` (a grow; never
    where it is infinite: the run's grows that fell short are spent)."""
    if config.local_mode or spark is None or session.is_connect(spark):
        return None
    size = config.num_processes
    missing = (full - size) // config.processes_per_task if math.isfinite(config.grow_wait) else 0
    free_since: List[float] = []  # since when the missing slots are free (empty: taken at the last check)

    def check(tasks: Sequence[TaskInfo]) -> Optional[str]:
        gone = session.decommissioning_hosts(spark) or {}
        if gone:
            ours = _ours(spark, tasks)
            hosts = {t.host for t in tasks}
            gone = {e: h for e, h in gone.items() if (e in ours if ours is not None else h in hosts)}
        mine = sorted(f"executor {e} on {h}" for e, h in gone.items())
        if mine:
            return f"{PREEMPTED}{', '.join(mine)} being decommissioned"
        if missing:
            free = session.free_task_slots(spark)
            if free is None or free < missing:
                free_since.clear()
                return None
            now = time.monotonic()
            if not free_since:
                free_since.append(now)
            if now - free_since[0] >= config.grow_wait:
                more = full - size
                return f"free slots for {more} more rank{'s' * (more > 1)}: growing to {full}"
        return None
    return check


def _ours(spark, tasks: Sequence[TaskInfo]) -> Optional[Set[str]]:
    """The ids of the executors running ``tasks``, where the status store can say: from each task's own record
    (written as the task starts) once every task has one, else from the stage's executor summaries (written at
    the store's first flush, an executor heartbeat in); ``None`` where it cannot say yet: the hosts decide then.
    The tasks' own ``host:port`` cannot be matched instead: it is the executor's connection to the driver,
    which the status store does not record (its ``hostPort`` is the block manager's)."""
    if not tasks:
        return None
    by_task = session.stage_task_executors(spark, tasks[0].stage)
    if by_task and all(t.partition in by_task for t in tasks):
        return {by_task[t.partition] for t in tasks}
    return session.stage_executors(spark, tasks[0].stage) or None


def grow_wait(config: RunConfig, short_grows: int) -> float:
    """An attempt's ``grow_wait`` after ``short_grows`` grows that fell short: 0, then :data:`GROW_BACKOFF_S`,
    doubled each time; infinite (no more grows) past ``spark.dist.maxShortGrows``."""
    if short_grows > config.max_short_grows:
        return math.inf
    return 0.0 if not short_grows else GROW_BACKOFF_S * 2 ** (short_grows - 1)


class ShortGrows:
    """An elastic run's count of grows that fell short (the attempt after a grow stop got fewer than
    ``num_processes`` ranks), and the ``grow_wait`` each attempt gets from it."""

    def __init__(self, config: RunConfig):
        self.config, self.count = config, 0

    def wait_for(self, ended: List[RankFailure], size: int) -> float:
        """The ``grow_wait`` of the next attempt, of ``size`` ranks, after the last one ended with ``ended``."""
        stop = stop_of(ended)
        if stop is not None and not is_preemption(stop) and size < self.config.num_processes:
            self.count += 1
            if self.count > self.config.max_short_grows:
                log.warning("spark_dist: run %s grew %d times without getting its %d ranks (%s=%d): it goes on "
                            "at %d ranks, without growing", self.config.run_id, self.count,
                            self.config.num_processes, CONF_MAX_SHORT_GROWS, self.config.max_short_grows, size)
        return grow_wait(self.config, self.count)


def resize_record(config: RunConfig, attempt: int, size: int, previous_size: int,
                  failures: List[RankFailure]) -> Optional[dict]:
    """The history record of an elastic run's size at its start and at each change, and of any run's restart
    after a preemption (``event`` ``"resize"`` or ``"preempted"``, ``world_size``, ``reason``; ``rank`` ``None``:
    the driver's); ``None`` for an attempt of a fixed-size run or of the same size as the last."""
    resized = stop_of(failures)
    preempted = is_preemption(resized)
    if not preempted and (not config.elastic or (attempt and size == previous_size)):
        return None
    if not attempt:
        reason = "start" if size == config.num_processes else "fewer slots than num_processes at the start"
    elif resized is not None:
        reason = resized.message
    else:
        lost = sorted({f.host for f in failures if f.kind == "lost"})
        reason = f"lost {', '.join(lost)}" if lost else "retry"
    return {"rank": None, "attempt": attempt, "time": time.time(), "event": "preempted" if preempted else "resize",
            "world_size": size, "reason": reason}


def too_many_preemptions(config: RunConfig, failures: List[RankFailure]) -> RankFailure:
    """The failure that ends a run preempted more often than ``spark.dist.maxPreemptions`` allows."""
    last = stop_of(failures)
    return RankFailure(last.rank, last.host, "lost", f"the run was preempted more than {CONF_MAX_PREEMPTIONS}="
                       f"{config.max_preemptions} times; the last: {last.message[len(PREEMPTED):]}", time=last.time)
