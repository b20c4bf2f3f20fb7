"""Lanes: long-lived barrier jobs that serve one run after another, so that a tuning study's trial costs a fork
of warm ranks instead of a Spark job (what Ray Tune's ``reuse_actors`` does for its trials).

A :class:`LanePool` starts at most as many lanes as trials run at once, each a barrier job of one trial's
tasks that holds its slots (:mod:`spark_dist.driver.slots`) from its start to its close; a lane between two
trials closes instead when another run of this process waits for slots, so such a run waits for one trial, not
for the study. A trial holds a :class:`LaneHandle` for its run (:meth:`LanePool.lane`); each attempt first
readies a lane on it (a new one after a failed or resized attempt, whose executor may be going), waiting for
slots outside the run's clocks, and its :class:`~spark_dist.driver.attempt.Attempt` then posts the attempt's
:class:`~spark_dist.wire.protocol.LaunchSpec` to the lane instead of submitting a job; the lane's tasks serve it
as a run's own tasks would (:mod:`spark_dist.task.lane`). Everything else of the attempt is its own: store,
secret, ports, coordinator, checkpoints, abort. A run stopped through its store (a pruned trial) leaves the lane
serving; a run that did not come back whole (a task's failure, a lost job) or whose job must be cancelled (a
silent host, a timeout, Ctrl-C) leaves it broken and cancelled, and no run is served on it again.

Lanes need a store the executors reach on the driver: a classic session. Under Spark Connect and in local mode
each trial is a run of its own (no pool).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
import uuid
from typing import Any, Iterator, List, Optional

from ..config import CONF_STORE_PORT, RunConfig
from ..spark import session
from ..task.lane import run_lane_partition
from ..wire.lanes import LaneFailure, LaneSpec, records_key, run_key, started_key
from ..wire.protocol import LaunchSpec
from ..wire.sealed_store import SealedStore, bind_in_range, host_store, join_store, own_address
from ..wire.sealing import lane_run_secret
from . import slots

_RECORDS_POLL_S = 1.0  # how often collect, waiting on one task's records, looks for another task's failure
_CLOSE_WAIT_S = 30.0  # how long a closing lane's tasks may take to return before its job is cancelled


class LaneLost(RuntimeError):
    """The lane's job ended (cancelled, an executor lost) or one of its tasks could not serve the run."""


class Lane:
    """One barrier job of ``config.num_tasks`` tasks serving runs in turn (see the module docstring).

    A lane serves a run only while it is :attr:`alive`. It stops being alive, for good, when its job ends, when
    it is cancelled, and when a run on it did not come back whole (a task's failure, a lost job, an interrupt):
    its tasks may then be anywhere in that run, so none may serve the next.
    """

    def __init__(self, spark, config: RunConfig, lane_id: str):
        self.spark, self.config = spark, config
        self.tag = f"spark_dist-lane-{lane_id}"
        listener = bind_in_range(config.bind_address, config.store_ports, CONF_STORE_PORT)
        self.spec = LaneSpec(lane_id, config.driver_host, listener.getsockname()[1], os.urandom(32),
                             config.use_gpu, config.processes_per_task, config.rendezvous_timeout)
        try:
            server, _ = host_store(config.bind_address, config.rendezvous_timeout, listener)
        except BaseException:
            listener.close()
            raise
        self._store: Optional[SealedStore] = SealedStore(server, self.spec.secret, self.spec.prefix)
        # A second client, for _wake: a TCPStore client runs one request at a time, and collect's holds it.
        self._waker = SealedStore(join_store(own_address(config.bind_address), self.spec.store_port, 30.0),
                                  self.spec.secret, self.spec.prefix)
        self._posted = 0  # runs posted so far: the next one's number
        self._serving: Optional[int] = None  # the number of the run being served
        self._unserved: List[int] = []  # the tasks whose records never came for the run the job ended under
        self._restarted: List[int] = []  # the tasks Spark started again (a retried stage), read as the job ended
        self._lock = threading.Lock()  # one run at a time
        self._ended = threading.Event()
        self._broken = threading.Event()  # cancelled, or a run on it did not come back whole
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._job, name=self.tag, daemon=True)
        self._thread.start()

    def run_secret(self, run_id: str, attempt: int) -> bytes:
        """The secret of a run's attempt served here, which its tasks derive from the lane's as well."""
        return lane_run_secret(self.spec.secret, run_id, attempt)

    @property
    def alive(self) -> bool:
        """Whether the lane may serve another run."""
        return not (self._ended.is_set() or self._broken.is_set()) and self._store is not None

    def _job(self) -> None:
        try:
            n = self.config.num_tasks
            frame = session.task_stage(self.spark, n, functools.partial(run_lane_partition, self.spec),
                                       barrier=True)
            description = (f"spark_dist lane {self.spec.lane_id}: trials of {self.config.num_processes} ranks, "
                           f"{self.config.backend}{', GPU' if self.config.use_gpu else ''}")
            with session.job_scope(self.spark, self.tag, description):
                if not self._broken.is_set():  # cancelled before its job started: no job
                    session.collect_records(frame)
        except BaseException as exc:  # noqa: BLE001 -- the lane is lost; the run it served says why
            self.error = exc
        finally:
            self._ended.set()
            self._wake()

    def _wake(self) -> None:
        """The job has ended: wake the run being served (``collect`` waits on its tasks' records keys) with a
        :class:`LaneFailure` of no task where a task's records never came. ``collect`` sets ``_serving`` before
        it reads ``_ended``, and this reads ``_serving`` after setting ``_ended``: one of the two sees the
        other."""
        number, store = self._serving, self._waker
        if number is None or store is None:
            return
        with contextlib.suppress(Exception):
            self._restarted = [p for p in range(self.config.num_tasks) if store.lookup(started_key(p), 0) > 1]
            self._unserved = [p for p in range(self.config.num_tasks) if not store.has(records_key(number, p))]
        for partition in self._unserved:
            with contextlib.suppress(Exception):
                store.put(records_key(number, partition), [LaneFailure(None, "the lane's Spark job ended")])

    def _job_ended(self, run_id: str) -> LaneLost:
        """The error of a run whose lane's job ended under it: which tasks never brought their records, then
        the job's own error, whole, as a run's own job would fail with it (so the outcome names the lost task's
        rank and Spark's reason). Where Spark ran the lane's stage again after a task of it failed (off local
        mode), the started-again tasks return at once and the job ends with no error: that is said instead."""
        tasks = ", ".join(map(str, self._unserved)) or "none"
        said = f"the Spark job of lane {self.spec.lane_id} ended while it served run {run_id} (no records from " \
               f"its task(s) {tasks})"
        if self.error is not None:
            return LaneLost(f"{said}: {type(self.error).__name__}: {self.error}".strip())
        if self._restarted:
            return LaneLost(
                f"{said}: a task of the lane's barrier stage failed and Spark ran the stage again (task(s) "
                f"{', '.join(map(str, self._restarted))} started again); the Spark UI's failed stage attempt of "
                f"job group {self.tag} says why (an executor lost, a Python worker killed)")
        return LaneLost(f"{said}: the job ended with no error")

    def collect(self, spec: LaunchSpec) -> List[Any]:
        """Serve the attempt ``spec`` on this lane: every task's records, in partition order, as a run's own
        job returns them. A run that does not come back whole (an error, an interrupt) leaves the lane broken
        and its job cancelled.

        Raises:
            LaneLost: the lane's job ended (or a task could not serve the run) before every task's records came;
                the message holds the job's error, whole.
        """
        with self._lock:
            number, store = self._posted, self._store
            self._serving = number
            if not self.alive:
                self._serving = None
                # Only an interrupt (TrialRun.stop, Ctrl-C) cancels a lane between ready() and here: said in
                # words the outcome reads as a cancel, which is not retried.
                raise LaneLost(f"run {spec.run_id} was not posted to lane {self.spec.lane_id}: the lane was "
                               "cancelled as part of cancellation of the study") if self._broken.is_set() \
                    else self._job_ended(spec.run_id)
            self._posted += 1
            whole = False
            try:
                store.put(run_key(number), dataclasses.replace(spec, secret=b""))  # the tasks derive it
                records = self._records(store, number, spec.run_id)
                whole = True
            finally:
                self._serving = None
                if whole:
                    for key in [run_key(number)] + [records_key(number, p) for p in range(self.config.num_tasks)]:
                        with contextlib.suppress(Exception):  # a lane going down: its store goes with it
                            store.delete(key)
                else:  # its other tasks may still be serving the run, or waiting for it: none serves the next
                    self.cancel()
            return records

    def _records(self, store: SealedStore, number: int, run_id: str) -> List[Any]:
        """Every task's records for run ``number``, in partition order, however long the run takes (a lost job
        wakes this wait: ``_wake``). A task's failure is raised as soon as it is posted, whichever task it is:
        the tasks before it may be waiting in the run's rendezvous for the one that failed.

        Raises:
            LaneLost: a task could not serve the run, or the lane's job ended.
        """
        got: dict = {}
        while len(got) < self.config.num_tasks:
            first = next(p for p in range(self.config.num_tasks) if p not in got)
            with contextlib.suppress(TimeoutError):
                got[first] = store.wait_for(records_key(number, first), _RECORDS_POLL_S)
            for partition in range(first + 1, self.config.num_tasks):
                if partition not in got and store.has(records_key(number, partition)):
                    got[partition] = store.get(records_key(number, partition))
            failure = next((r for records in got.values() for r in records if isinstance(r, LaneFailure)), None)
            if failure is not None and failure.partition is None:
                raise self._job_ended(run_id)
            if failure is not None:
                raise LaneLost(f"lane {self.spec.lane_id}: task {failure.partition} could not serve run {run_id}: "
                               f"{failure.error}")
        return [r for partition in sorted(got) for r in got[partition]]

    def cancel(self) -> None:
        """Cancel the lane's job: its tasks and the ranks they serve end now; the lane serves no other run."""
        self._broken.set()
        with contextlib.suppress(Exception):  # a session going down with an interrupt
            session.cancel(self.spark, self.tag)

    def close(self) -> None:
        """Let the tasks return (cancelling the job if they do not in time, or at once for a broken lane), then
        close the lane's store."""
        if not self._ended.is_set() and self._store is not None:
            if not self._broken.is_set():
                with contextlib.suppress(Exception):  # the tasks end once the store is gone
                    self._store.put(run_key(self._posted), None)  # no run is posted any more: ``_lock`` is free
                self._ended.wait(_CLOSE_WAIT_S)
            # Cancelled again and again: a cancel that came before the job was submitted found nothing to cancel.
            for _ in range(int(_CLOSE_WAIT_S)):
                if self._ended.is_set():
                    break
                self.cancel()
                self._ended.wait(1.0)
        self._thread.join(_CLOSE_WAIT_S)
        self._store = self._waker = None  # the last references: the store's server stops, its port closes


class LanePool:
    """The lanes of one study: at most one per trial running at once, started on first need, replaced when
    lost, all closed by :meth:`close`.

    Args:
        spark: a classic SparkSession.
        config: one trial's settings (its ``num_tasks``, GPUs, ports and addresses).
    """

    def __init__(self, spark, config: RunConfig):
        self.spark, self.config = spark, config
        self.pool_id = uuid.uuid4().hex[:12]  # its lanes are <pool_id>-1, -2, ... in the order started
        self._free: List[Lane] = []
        self._open: List[Lane] = []
        self._started = 0
        self._starting = 0  # lanes waiting for their slots: while any does, no lane given back is kept idle
        self._lock = threading.Lock()  # over the lists and counters only: making or closing a lane takes time
        self._closed = False

    @contextlib.contextmanager
    def lane(self) -> Iterator["LaneHandle"]:
        """A handle for one trial's run: its attempts take a lane as they start (:meth:`LaneHandle.ready`),
        and the last one is given back after the run."""
        handle = LaneHandle(self)
        try:
            yield handle
        finally:
            if handle.current is not None:
                self._give(handle.current)

    def _take(self) -> Lane:
        """A free live lane, else a new one (waiting for its slots).

        Raises:
            LaneLost: the pool is closed (the study ended or was interrupted).
        """
        while True:
            with self._lock:
                self._check_open()
                lane = self._free.pop() if self._free else None
            if lane is None:
                return self._start()
            if lane.alive:
                return lane
            self._retire(lane)

    def _check_open(self) -> None:  # under self._lock
        if self._closed:
            raise LaneLost("the study's lanes are closed: it ended or was interrupted")

    def _start(self) -> Lane:
        """A new lane, once its slots are free; it holds them for its life (other runs of this process wait).
        Idle lanes are retired first, and none is kept idle while this waits: their slots may be the ones it
        waits for (an executor gone leaves fewer).

        Raises:
            LaneLost: the pool is closed, or closed while the lane was made.
        """
        ledger = slots.ledger_for(self.spark)
        with self._lock:
            self._check_open()
            self._starting += 1
            idle, self._free = self._free, []
        try:
            for lane in idle:
                self._retire(lane)
            ledger.acquire(self.config.num_tasks)
        finally:
            with self._lock:
                self._starting -= 1
        try:
            with self._lock:
                self._check_open()
                self._started += 1
                lane_id = f"{self.pool_id}-{self._started}"
            lane = Lane(self.spark, self.config, lane_id)
        except BaseException:
            ledger.release(self.config.num_tasks)
            raise
        with self._lock:
            self._open.append(lane)
            closed = self._closed
        if closed:  # closed while the lane was made: it goes at once, as close() retires the others
            lane.cancel()
            self._retire(lane)
            self._check_open()
        return lane

    def _give(self, lane: Lane) -> None:
        """Keep the lane for the next trial, unless it is lost, the pool closed, or a run of this process waits
        for slots: an idle lane would hold them from it until the study ends, so it yields them."""
        with self._lock:
            if lane.alive and not (self._closed or self._starting or slots.ledger_for(self.spark).waiting()):
                self._free.append(lane)
                return
        self._retire(lane)

    def _retire(self, lane: Lane) -> None:
        """Close ``lane`` and give its slots back (once, whoever else retires it)."""
        with self._lock:
            if lane not in self._open:
                return
            self._open.remove(lane)
        try:
            lane.close()
        finally:
            slots.ledger_for(self.spark).release(self.config.num_tasks)

    def cancel_all(self) -> None:
        """Ctrl-C on the driver: no lane starts any more, and every lane's job is cancelled (its ranks end now)."""
        with self._lock:
            self._closed = True
            lanes = list(self._open)
        for lane in lanes:
            lane.cancel()

    def close(self) -> None:
        """Close every lane (their tasks return, their slots are given back)."""
        with self._lock:
            self._closed = True
            self._free.clear()
            lanes = list(self._open)
        try:
            for lane in lanes:
                self._retire(lane)
        except BaseException:  # an interrupt while closing: the lanes left are cancelled, their slots given back
            with self._lock:
                left, self._open = self._open, []
            for lane in left:
                lane.cancel()
                slots.ledger_for(self.spark).release(self.config.num_tasks)
            raise


class LaneHandle:
    """A trial's lane, as its run's attempts use it: :meth:`ready` before each attempt, then ``collect`` and
    ``cancel``."""

    def __init__(self, pool: LanePool):
        self.pool = pool
        self.current: Optional[Lane] = None

    @contextlib.contextmanager
    def ready(self, fresh: bool) -> Iterator[float]:
        """A live lane for the next attempt; yields the seconds spent waiting for one (its slots), which is
        not the run's time. ``fresh``: a new lane even if the current one lives (a retry, a resize: the
        attempt before may have ended on an executor that is going, or left a task behind).

        Raises:
            LaneLost: the study's lanes are closed.
        """
        started = time.monotonic()
        if self.current is not None and (fresh or not self.current.alive):
            lane, self.current = self.current, None
            self.pool._retire(lane)
        if self.current is None:  # after a failure or a resize, not another trial's idle lane either
            self.current = self.pool._start() if fresh else self.pool._take()
        yield time.monotonic() - started

    def _ready_lane(self) -> Lane:
        if self.current is None:
            raise LaneLost("no lane was made ready for this attempt")
        return self.current

    def run_secret(self, run_id: str, attempt: int) -> bytes:
        return self._ready_lane().run_secret(run_id, attempt)

    def collect(self, spec: LaunchSpec) -> List[Any]:
        return self._ready_lane().collect(spec)

    def cancel(self) -> None:
        lane = self.current
        if lane is not None:
            lane.cancel()
