"""Task slots held by the runs of this process: several runs at once from threads (a tuning study's trials,
``CrossValidator(parallelism=n)`` fits) take turns instead of oversubscribing the cluster.

Spark schedules a barrier stage only once all its tasks can start together, so a run submitted while other
runs hold the slots would sit in Spark's queue with its store open and its rendezvous clock running
(``spark.dist.rendezvousTimeout``): a long run ahead of it would fail it. Each attempt therefore first takes its
tasks' slots here, first come first served, and gives them back once its job has ended; the barrier job is
submitted only when they fit. The capacity is the cluster's slot count read at each check (executors come and
go). Jobs of other kinds (a dataset's write, a user's own) are not counted: Spark's queue absorbs those.

Invariant: a run that needs more slots than the cluster has is let through as soon as nothing of this
process holds any, so Spark's own check (or ``wait_for_slots``'s error) decides, never a wait here forever.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Callable, Dict, Iterator, Optional

from ..spark import session

_RECHECK_S = 0.5  # how often a waiting run reads the cluster's slot count again


class SlotLedger:
    """The slots this process's runs hold on one Spark application; waiters served in arrival order."""

    def __init__(self, capacity: Callable[[], Optional[int]]):
        self.capacity = capacity
        self.held = 0
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._queue: list = []  # tickets of the runs waiting, oldest first

    def acquire(self, needed: int) -> float:
        """Wait until ``needed`` slots are free (or nothing is held); the seconds waited."""
        started = time.monotonic()
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                while not (self._queue[0] == ticket and self._fits(needed)):
                    self._cond.wait(_RECHECK_S)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
            self.held += needed
        return time.monotonic() - started

    def waiting(self) -> bool:
        """Whether a run of this process waits for slots."""
        with self._cond:
            return bool(self._queue)

    def release(self, needed: int) -> None:
        with self._cond:
            self.held -= needed
            self._cond.notify_all()

    def _fits(self, needed: int) -> bool:
        if self.held == 0:
            return True
        try:
            capacity = self.capacity()
        except Exception:  # noqa: BLE001 -- a session stopping under us: let Spark say what is wrong
            return True
        return capacity is None or self.held + needed <= capacity


_LEDGERS: Dict[str, SlotLedger] = {}
_LOCK = threading.Lock()


def ledger_for(spark) -> SlotLedger:
    """The ledger of ``spark``'s application (one per application id, shared by every session of it)."""
    key = session.app_id(spark)
    with _LOCK:
        ledger = _LEDGERS.get(key)
        if ledger is None:
            ledger = _LEDGERS[key] = SlotLedger(lambda: session.task_slots(spark))
        return ledger


@contextlib.contextmanager
def held(spark, num_tasks: int, local_mode: bool) -> Iterator[float]:
    """Hold ``num_tasks`` slots of ``spark``'s cluster for the block; yields the seconds spent waiting for
    them. Local-mode runs take no Spark slot."""
    if local_mode or spark is None:
        yield 0.0
        return
    ledger = ledger_for(spark)
    waited = ledger.acquire(num_tasks)
    try:
        yield waited
    finally:
        ledger.release(num_tasks)
