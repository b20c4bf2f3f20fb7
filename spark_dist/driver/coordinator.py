"""Watching one attempt through its store: where the store is hosted, the same loop runs.

On a classic session and in local mode the driver hosts the store and runs the :class:`Coordinator`; under
Spark Connect the client may be unreachable from the executors, so the first task hosts both (see
:mod:`spark_dist.driver.first_task`). Either way the coordinator assigns ranks once every task has come,
relays the ranks' reports in order, tells a host whose ranks went silent, enforces the timeout and the abort
grace, and finally says what it saw (:class:`~spark_dist.driver.outcome.AttemptEvidence`) for
:func:`~spark_dist.driver.outcome.outcome_of`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..backends.base import torchrun_env
from ..config import RunConfig
from .outcome import AttemptEvidence, JobError
from .stall import STACKS_WAIT_S, RankStack, StallDiagnosis, StallWatch, diagnose
from ..task.output import MAX_UNREAD, OutputRelay
from ..wire.protocol import (ABORT, ARRIVED, FAILURES, HEARTBEAT_S, LOG_KEY, PROGRESS, REPORTS, RESIZE,
                             RUN_SUCCEEDED, STACKS_WANTED, Abort, LaunchSpec, SlotAssignment, assignment_key, beat_key,
                             clock_key, ended_key, stack_key, stall_stack_key, task_key)
from ..wire.ranks import RankInfo, TaskInfo, assign_ranks
from ..wire.sealed_store import FORGED, SealedStore
from ..wire.store_log import StoreLog

_EAGER_RENDEZVOUS_S = 0.5  # how long the driver looks for the tasks every 2 ms before every 20 ms
PROGRESS_EVERY_S = 0.25  # how often the driver reads rank 0's progress
RESIZE_CHECK_S = 2.0  # how often an elastic run below its size looks for free slots (a py4j call or two)


class Coordinator:
    """The watch over one attempt.

    Args:
        store: the attempt's sealed store (hosted by the caller).
        config, spec, backend: the run's settings, what the tasks were given, and the backend (its
            ``start`` runs at assignment, where the coordinator runs).
        job_ended: whether the tasks are all done (the Spark job returned); ``None``: once every rank ended
            (:meth:`all_ranks_ended`), where no job can be watched (in the first task under Spark Connect).
        cancel: stops the tasks that cannot stop by themselves (a silent host's; after the abort grace).
        on_report: called with each ``ctx.report`` record, in order.
        on_output: called with ``(rank, stream, line)`` for each line a rank printed (``None``: not fetched).
        on_progress: called with rank 0's latest ``(epoch, step, steps, steps_per_second)``.
        deadline: ``time.monotonic()`` past which the run has exceeded ``timeout`` (``None``: no limit).
        host: the address the backend's own servers bind (the store's host).
        resize_check: given where the tasks run, why the run should stop at its next checkpoint (a preemption, a grow:
            :func:`spark_dist.driver.elastic.watch`), else ``None``; run every RESIZE_CHECK_S once the ranks are
            assigned; its first reason goes to the ranks (``resize``).
        on_poll: called every poll; what it raises leaves the watch as a report hook's exception does (a
            stopped trial of a study).
        on_stall: called with each stall's :class:`~spark_dist.driver.stall.StallDiagnosis` (default: its lines
            as a ``log_to_driver`` record through ``on_report``).
    """

    def __init__(self, store: SealedStore, config: RunConfig, spec: LaunchSpec, backend,
                 job_ended: Optional[Callable[[], bool]], cancel: Callable[[], None], on_report: Callable[[dict], None],
                 deadline: Optional[float], host: str, bind_address: Optional[str] = None,
                 on_output: Optional[Callable[[int, str, str], None]] = None,
                 on_progress: Optional[Callable[[tuple], None]] = None,
                 resize_check: Optional[Callable[[List[TaskInfo]], Optional[str]]] = None,
                 on_poll: Optional[Callable[[], None]] = None,
                 on_stall: Optional[Callable[[StallDiagnosis], None]] = None):
        self.store, self.config, self.spec, self.backend = store, config, spec, backend
        # Not a bound method of self: a coordinator in a cycle lives until the cyclic GC runs, and with it the
        # store it holds, which the first task hosts under Spark Connect (its port must be free at its end).
        self._job_ended = job_ended
        self.cancel, self.on_report, self.on_progress, self.on_poll = cancel, on_report, on_progress, on_poll
        self.deadline, self.host, self.bind_address = deadline, host, bind_address or host
        # Read whatever log_ranks says: the supervisors publish only the lines someone shows (relay_output).
        self.output = OutputRelay(store, on_output or (lambda *line: None))
        self.reports = StoreLog(store, REPORTS)
        self.failures_log = StoreLog(store, FAILURES)
        self.failures: Dict[int, Any] = {}  # rank -> its first RankFailure, in the order they arrived
        self.next_progress = 0.0
        self.last_progress = None
        self.ended: set = set()  # ranks whose supervisor said (sealed) that they ended
        self.succeeded: Optional[bool] = None  # what ``succeeded`` told the tasks, once settled
        self.tasks: List[TaskInfo] = []  # TaskInfo by task index, once all tasks came
        self.ranks: List[RankInfo] = []  # RankInfo by task index, once assigned
        self.rendezvous_missing: List[int] = []  # task indexes that never reached the store
        self.beats: Dict[int, Any] = {}  # rank -> (its beat count, when that count was first seen)
        self.next_beat_check = 0.0
        self.lost_ranks: List[RankInfo] = []  # the ranks on a host that went silent
        self.silent_ranks: List[int] = []  # among them, those whose own supervisor's beats lapsed
        self.timed_out = False
        self.cancelled = False  # whether this coordinator cancelled the job itself
        self.resize_check = resize_check
        self.next_resize_check = 0.0
        self.steps: Dict[int, int] = {}  # rank -> its step count, as its latest beat said
        self.stall_watch = StallWatch(config.stall_timeout, config.stall_action)
        self.on_stall = on_stall or (lambda diagnosis: on_report({LOG_KEY: "\n".join(
            f"[spark_dist] {line}" for line in diagnosis.lines())}))
        self.stall_asked: Optional[Tuple[float, float]] = None  # (when the stacks were asked for, still for)
        self.stalled: Optional[StallDiagnosis] = None  # the stall that ends the run (stallAction=fail)
        self.failed_at: Optional[float] = None  # time.time() when the attempt's abort was set (a failure, ...)

    def watch(self, poll_until: Callable[[float], bool]) -> None:
        """Assign ranks, relay reports, enforce abort and timeout until ``job_ended()``.

        ``poll_until(seconds)`` waits that long at most and returns True once the job has ended (an event's
        ``wait``)."""
        n = self.config.num_processes
        assigned = False
        abort_at = None
        cancelled = False
        started = time.monotonic()
        rendezvous_deadline = started + self.config.rendezvous_timeout
        poll = 0.002
        job_ended = self._job_ended or self.all_ranks_ended
        while not poll_until(poll) and not job_ended():
            now = time.monotonic()
            if not assigned and abort_at is None:
                # Warm Python workers arrive within the eager window: look often then. Cold ones import torch
                # first: look less often after it, and leave the cores to them (BENCHMARKS.md, rendezvous).
                poll = 0.002 if now - started < _EAGER_RENDEZVOUS_S else 0.02
                tasks = self._arrived_tasks(n)
                if tasks is not None:
                    self._assign(tasks)
                    assigned = True
                    poll = 0.01
                elif now > rendezvous_deadline:
                    self.store.put(ABORT, Abort.RENDEZVOUS_TIMEOUT)
                    abort_at = now
                    self.rendezvous_missing = [i for i in range(n) if not self.store.has(task_key(i))]
                    # The tasks that came wait on their own key: wake them with "no assignment".
                    self.store.put_many({assignment_key(i): None for i in range(n)})
            else:
                poll = min(poll * 1.5, 0.1)
            if self.on_poll is not None:
                self.on_poll()
            self.drain_reports()
            if self.drain_output() >= MAX_UNREAD:
                poll = 0.01  # the ranks print fast: more waits, and their supervisors wait for room in the store
            self.drain_progress(now)
            self._settle(assigned, abort_at is not None)
            if assigned and abort_at is None:
                self._check_resize(now)
            if assigned and abort_at is None and self._silent_hosts(now):
                self.store.put(ABORT, Abort.HOST_LOST)
                abort_at = now
                cancelled = self.cancelled = True  # the silent host's tasks cannot stop by themselves: no grace
                self.cancel()
            if assigned and abort_at is None and self._stall_settled(now):
                self.store.put(ABORT, Abort.STALLED)
                abort_at = now
            if abort_at is None and self.store.has(ABORT):
                abort_at = now
            if self.deadline is not None and now > self.deadline and abort_at is None:
                self.store.put(ABORT, Abort.TIMEOUT)
                abort_at, self.timed_out = now, True
            if abort_at is not None and self.failed_at is None:  # the goodput's end of this attempt's work
                self.failed_at = time.time() - (now - abort_at)
            if abort_at is not None and not cancelled and now - abort_at > self.config.abort_grace_period:
                cancelled = self.cancelled = True
                self.cancel()
        # Under Spark Connect the watch ends once every rank ended, which may be before the loop said so.
        self._settle(assigned, abort_at is not None)

    def _settle(self, assigned: bool, aborted: bool) -> None:
        """Tell the tasks, once, how the run ended (``succeeded``): True once every rank ended and none failed,
        False once it was aborted. Tasks whose ranks ended well wait on it before removing what a retry
        would resume from (:func:`~spark_dist.task.checkpoint_dirs.remove_after_success`)."""
        if not assigned or self.succeeded is not None:
            return
        if aborted:
            self.succeeded = False
        elif self.all_ranks_ended():
            self.succeeded = not self.store.has(ABORT) and not self._take_failures()
        else:
            return
        self.store.put(RUN_SUCCEEDED, self.succeeded)

    def _check_resize(self, now: float) -> None:
        """Tell the ranks, once, why the run should change size (rank 0 stops at its next checkpoint)."""
        if self.resize_check is None or now < self.next_resize_check:
            return
        self.next_resize_check = now + RESIZE_CHECK_S
        reason = self.resize_check(self.tasks)
        if reason is not None:
            self.store.put(RESIZE, reason)
            self.resize_check = None

    def _arrived_tasks(self, n: int) -> Optional[List[TaskInfo]]:
        """Every slot's TaskInfo once all ``n`` came, else ``None``: the ``arrived`` counter says when to
        look (one round trip a poll), then one check and one read of all keys. A forged counter costs one
        check; a forged value under a task's key counts as absent until the task's own replaces it."""
        if self.store.counter(ARRIVED, 0) < n:
            return None
        keys = [task_key(i) for i in range(n)]
        if not self.store.raw.check([self.store.key(k) for k in keys]):
            return None
        tasks = self.store.get_many(keys)
        return None if any(t is FORGED for t in tasks) else tasks

    def all_ranks_ended(self) -> bool:
        """Every rank's supervisor has said it ended (or the run never got as far as assigning ranks and was
        aborted): the tasks' end, seen from the store. Each rank's sealed ``ended`` key is looked for until
        it is there, the first missing one ending the look: a round trip or two a poll."""
        if not self.ranks:
            return bool(self.rendezvous_missing)
        return all(self._ended(r.rank) for r in self.ranks)

    def _silent_hosts(self, now: float) -> bool:
        """Whether a host went silent: its ranks' supervisors stopped beating (a host off the network, a
        frozen machine) for ``spark.dist.hostLostTimeout``; Spark itself notices only after its executor
        heartbeat timeout (60-120 s). Sets ``lost_ranks`` to every unfinished rank on such hosts. Read once a
        beat (HEARTBEAT_S); a rank that never beat yet (its worker still importing torch) gets 60 s at least. A
        beat is a sealed, rising number: only one higher than the last seen counts, so a peer can neither forge
        nor replay one."""
        if now < self.next_beat_check:
            return False
        self.next_beat_check = now + HEARTBEAT_S  # a beat comes this often: a look in between finds nothing new
        running = [r for r in self.ranks if r.rank not in self.ended]
        beats = self._beats([r.rank for r in running])
        self.steps.update({rank: steps for rank, (_, steps) in beats.items()})
        silent_hosts, silent = set(), []
        for r in running:
            count = beats[r.rank][0]
            seen_count, since = self.beats.get(r.rank, (None, now))
            if seen_count is None or count > seen_count:
                self.beats[r.rank] = (count, now)
                continue
            bound = self.config.host_lost_timeout if count else max(self.config.host_lost_timeout, 60.0)
            if now - since > bound and not self._ended(r.rank):
                silent_hosts.add(r.host)
                silent.append(r.rank)
        self.lost_ranks = [r for r in running if r.host in silent_hosts and not self._ended(r.rank)]
        self.silent_ranks = silent
        if not self.lost_ranks and self.stall_asked is None and self.stall_watch.observe(
                now, {r.rank: self.steps.get(r.rank, 0) for r in running}):
            self.stall_asked = (now, self.stall_watch.still_for(now))
            self.store.put(STACKS_WANTED, self.stall_watch.stalls)  # every supervisor dumps its rank's stack
        return bool(self.lost_ranks)

    def _beats(self, ranks: List[int]) -> Dict[int, Tuple[int, int]]:
        """Each rank's latest sealed beat, ``(number, steps)`` (``(0, 0)``: none yet, or not ours): one round
        trip once every rank has beaten, one per rank before."""
        keys = [beat_key(r) for r in ranks]
        if ranks and self.store.raw.check([self.store.key(k) for k in keys]):
            values = self.store.get_many(keys)
        else:
            values = [self.store.lookup(k, 0) for k in keys]
        return {r: v if _is_beat(v) else (0, 0) for r, v in zip(ranks, values)}

    def _stall_settled(self, now: float) -> bool:
        """Once the stacks a stall asked for are in (or STACKS_WAIT_S passed): the diagnosis goes to
        ``on_stall``; True when ``spark.dist.stallAction`` says it ends the run (then ``stalled`` holds it)."""
        if self.stall_asked is None:
            return False
        asked_at, still_for = self.stall_asked
        number = self.stall_watch.stalls
        running = [r for r in self.ranks if not self._ended(r.rank)]
        found = {}  # rank -> (its stack, its NCCL Flight Recorder dump or None)
        for r in running:
            value = self.store.lookup(stall_stack_key(r.rank))
            if isinstance(value, tuple) and len(value) == 3 and value[0] == number:
                found[r.rank] = (str(value[1]), value[2] if isinstance(value[2], bytes) else None)
        if len(found) < len(running) and now - asked_at < STACKS_WAIT_S:
            return False
        self.stall_asked = None
        diagnosis = diagnose(still_for + now - asked_at, [
            RankStack(r.rank, r.host, self.steps.get(r.rank, 0),
                      *found.get(r.rank, ("(no stack: its supervisor did not answer in time)", None)))
            for r in running], number)
        self.on_stall(diagnosis)
        if self.config.stall_action == "fail":
            self.stalled = diagnosis
            return True
        return False

    def _ended(self, rank: int) -> bool:
        """Whether ``rank``'s supervisor said (sealed) that it ended; remembered once seen."""
        if rank not in self.ended and self.store.has(ended_key(rank)):
            self.ended.add(rank)
        return rank in self.ended

    def _assign(self, tasks: List[TaskInfo]) -> None:
        ranks = assign_ranks(tasks, self.config.layout)
        self.tasks, self.ranks = tasks, ranks
        extra = self.backend.start(ranks, self.host, self.config.run_id, bind_address=self.bind_address)
        self.store.put_many({
            assignment_key(task.task_index): SlotAssignment(r, {
                **torchrun_env(r, self.spec.store_host, self.spec.store_port, self.spec.attempt,
                               self.config.use_gpu), **extra.get(r.rank, {})})
            for task, r in zip(tasks, ranks)})

    def drain_reports(self, final: bool = False) -> None:
        """Relay the reports that arrived, in the order the store received them (taken: deleted there)."""
        while True:
            records = self.reports.take()
            for record in records:
                self.on_report(record)
            if not final or not records:
                return

    def drain_output(self, final: bool = False) -> int:
        """Pass on the lines the ranks printed since the last call, each rank's in order (``final``: all that
        is left); returns the number of records taken."""
        taken = self.output.drain()
        while final and taken:
            taken = self.output.drain()
        return taken

    def drain_progress(self, now: float, final: bool = False) -> None:
        """Pass rank 0's latest progress on, when it changed (read every PROGRESS_EVERY_S, and at the end)."""
        if self.on_progress is None or (now < self.next_progress and not final):
            return
        self.next_progress = now + PROGRESS_EVERY_S
        progress = self.store.lookup(PROGRESS)
        if progress is not None and progress != self.last_progress:
            self.last_progress = progress
            self.on_progress(progress)

    def _take_failures(self) -> List[Any]:
        """The failures reported so far (each rank's first; at most one a rank is kept, whatever arrives)."""
        for failure in self.failures_log.take():
            if failure.rank not in self.failures and len(self.failures) < max(len(self.ranks), 1):
                failure.seq = len(self.failures) + 1  # the order they arrived: root_cause's first
                self.failures[failure.rank] = failure
        return list(self.failures.values())

    def seen(self, records=(), job_error: Optional[BaseException] = None) -> AttemptEvidence:
        """What this attempt saw, read from the store once the tasks are done."""
        store = self.store
        failures = tuple(self._take_failures())
        if self.failed_at is None and failures:
            # Every rank ended before the watch looked at the abort (a rank died and the others raised at once):
            # the attempt's work ended with its first failure, not when the driver noted the job's end.
            self.failed_at = min((f.time for f in failures if f.time), default=None)
        stacks = {r.rank: stack for r in self.ranks if (stack := store.lookup(stack_key(r.rank))) is not None}
        clocks = {r.rank: clock for r in self.ranks if isinstance(clock := store.lookup(clock_key(r.rank)), dict)}
        return AttemptEvidence(
            driver_host=self.config.driver_host, rendezvous_timeout=self.config.rendezvous_timeout,
            host_lost_timeout=self.config.host_lost_timeout, timeout=self.config.timeout, now=time.time(),
            tasks=tuple(self.tasks), ranks=tuple(self.ranks), failures=failures, stacks=stacks,
            records=tuple(records), timed_out=self.timed_out, lost_ranks=tuple(r.rank for r in self.lost_ranks),
            rendezvous_missing=tuple(self.rendezvous_missing), cancelled_here=self.cancelled, stalled=self.stalled,
            clocks=clocks, failed_at=self.failed_at,
            job_error=None if job_error is None else JobError(type(job_error).__name__, str(job_error)))


def _is_beat(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(type(v) is int for v in value)
