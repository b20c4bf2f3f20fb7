"""Watching one attempt through its store: where the store is hosted, the same loop runs.

On a classic session and in local mode the driver hosts the store and runs the :class:`Coordinator`; under
Spark Connect the client may be unreachable from the executors, so the first task hosts both (see
:mod:`spark_dist.connect_launch`). Either way the coordinator assigns ranks once every task has come,
relays the ranks' reports in order, tells a host whose ranks went silent, enforces the timeout and the abort
grace, and finally says what it saw (:class:`~spark_dist.outcome.Seen`) for :func:`~spark_dist.outcome.outcome_of`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from .backends.base import torchrun_env
from .config import RunConfig
from .outcome import JobError, Seen
from .output import OutputRelay
from .protocol import (ABORT, ASSIGNMENT, BEAT_ENDED, FAILURE_SEQ, REPORT_SEQ, Abort, Assignment, LaunchSpec,
                       beat_key, failure_key, report_key, stack_key, task_key)
from .rendezvous import RankInfo, SignedStore, TaskInfo, assign_ranks

REPORT_SLOT_GRACE_S = 2.0  # an empty report slot is skipped after this long (see Coordinator.drain_reports)
_EAGER_RENDEZVOUS_S = 0.5  # how long the driver looks for the tasks every 2 ms before every 20 ms


class Coordinator:
    """The watch over one attempt.

    Args:
        store: the attempt's signed store (hosted by the caller).
        config, spec, backend: the run's settings, what the tasks were given, and the backend (its
            ``start`` runs at assignment, where the coordinator runs).
        job_ended: whether the tasks are all done (the Spark job returned); ``None``: once every rank ended
            (:meth:`all_ranks_ended`), where no job can be watched (in the first task under Spark Connect).
        cancel: stops the tasks that cannot stop by themselves (a silent host's; after the abort grace).
        on_report: called with each ``ctx.report`` record, in order.
        on_output: called with ``(rank, stream, line)`` for each line a rank printed (``None``: not fetched).
        deadline: ``time.monotonic()`` past which the run has exceeded ``timeout`` (``None``: no limit).
        host: the address the backend's own servers bind (the store's host).
    """

    def __init__(self, store: SignedStore, config: RunConfig, spec: LaunchSpec, backend,
                 job_ended: Optional[Callable[[], bool]], cancel: Callable[[], None], on_report: Callable[[dict], None],
                 deadline: Optional[float], host: str, bind_address: Optional[str] = None,
                 on_output: Optional[Callable[[int, str, str], None]] = None):
        self.store, self.config, self.spec, self.backend = store, config, spec, backend
        self.job_ended = job_ended or self.all_ranks_ended
        self.cancel, self.on_report = cancel, on_report
        self.deadline, self.host, self.bind_address = deadline, host, bind_address or host
        self.output = None if on_output is None else OutputRelay(store, on_output)
        self.reports_seen = 0
        self.empty_slot_since: Dict[int, float] = {}
        self.tasks: List[TaskInfo] = []  # TaskInfo by task index, once all tasks came
        self.ranks: List[RankInfo] = []  # RankInfo by task index, once assigned
        self.rendezvous_missing: List[int] = []  # task indexes that never reached the store
        self.beats: Dict[int, Any] = {}  # rank -> (its beat count, when that count was first seen)
        self.next_beat_check = 0.0
        self.lost_ranks: List[RankInfo] = []  # the ranks on a host that went silent
        self.timed_out = False
        self.cancelled = False  # whether this coordinator cancelled the job itself

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
        while not poll_until(poll) and not self.job_ended():
            now = time.monotonic()
            if not assigned and abort_at is None:
                # Warm Python workers arrive within ~0.2 s: look every 2 ms then. Cold ones import torch first
                # (seconds): look every 20 ms, and leave the cores to them (a 2 ms poll cost ~6% of a core).
                poll = 0.002 if now - started < _EAGER_RENDEZVOUS_S else 0.02
                if all(self.store.has(task_key(i)) for i in range(n)):
                    self._assign([self.store.get(task_key(i)) for i in range(n)])
                    assigned = True
                    poll = 0.01
                elif now > rendezvous_deadline:
                    self.store.put(ABORT, Abort.RENDEZVOUS_TIMEOUT)
                    abort_at = now
                    self.rendezvous_missing = [i for i in range(n) if not self.store.has(task_key(i))]
            else:
                poll = min(poll * 1.5, 0.1)
            self.drain_reports()
            self.drain_output()
            if assigned and abort_at is None and self._silent_hosts(now):
                self.store.put(ABORT, Abort.HOST_LOST)
                abort_at = now
                cancelled = self.cancelled = True  # the silent host's tasks cannot stop by themselves: no grace
                self.cancel()
            if abort_at is None and self.store.has(ABORT):
                abort_at = now
            if self.deadline is not None and now > self.deadline and abort_at is None:
                self.store.put(ABORT, Abort.TIMEOUT)
                abort_at, self.timed_out = now, True
            if abort_at is not None and not cancelled and now - abort_at > self.config.abort_grace_period:
                cancelled = self.cancelled = True
                self.cancel()

    def all_ranks_ended(self) -> bool:
        """Every rank's supervisor has said it ended (or the run never got as far as assigning ranks and was
        aborted): the tasks' end, seen from the store."""
        if not self.ranks:
            return bool(self.rendezvous_missing)
        return all(self.store.counter(beat_key(r.rank), 0) >= BEAT_ENDED for r in self.ranks)

    def _silent_hosts(self, now: float) -> bool:
        """Whether a host went silent: its ranks' supervisors stopped beating (a host off the network, a
        frozen machine) for ``spark.dist.hostLostTimeout``; Spark itself notices only after its executor
        heartbeat timeout (60-120 s). Sets ``lost_ranks`` to every unfinished rank on such hosts. Read every
        half second; a rank that never beat yet (its worker still importing torch) gets 60 s at least."""
        if now < self.next_beat_check:
            return False
        self.next_beat_check = now + 0.5
        counts = {r.rank: self.store.counter(beat_key(r.rank), 0) for r in self.ranks}
        silent_hosts = set()
        for r in self.ranks:
            count = counts[r.rank]
            seen_count, since = self.beats.get(r.rank, (None, now))
            if count != seen_count:
                self.beats[r.rank] = (count, now)
                continue
            bound = self.config.host_lost_timeout if count else max(self.config.host_lost_timeout, 60.0)
            if count < BEAT_ENDED and now - since > bound:
                silent_hosts.add(r.host)
        self.lost_ranks = [r for r in self.ranks if r.host in silent_hosts and counts[r.rank] < BEAT_ENDED]
        return bool(self.lost_ranks)

    def _assign(self, tasks: List[TaskInfo]) -> None:
        ranks = assign_ranks(tasks, self.config.layout)
        self.tasks, self.ranks = tasks, ranks
        extra = self.backend.start(ranks, self.host, self.config.run_id, bind_address=self.bind_address)
        envs = tuple({**torchrun_env(r, self.spec.store_host, self.spec.store_port, self.spec.attempt,
                                     self.config.use_gpu), **extra.get(r.rank, {})} for r in ranks)
        self.store.put(ASSIGNMENT, Assignment(tuple(ranks), envs))

    def drain_reports(self, final: bool = False) -> None:
        """Relay the reports in order. A slot whose number was taken but which holds no signed value (a
        stranger bumped the counter or wrote a forged value; a rank died between counting and writing) is
        skipped once it has stayed empty for REPORT_SLOT_GRACE_S (at once when the job has ended), so it
        never holds up the real reports."""
        latest = self.store.counter(REPORT_SEQ, 0)
        now = time.monotonic()
        for seq in range(self.reports_seen + 1, latest + 1):
            self.empty_slot_since.setdefault(seq, now)  # the grace runs from when the number was first seen
        while self.reports_seen < latest:
            seq = self.reports_seen + 1
            if self.store.has(report_key(seq)):
                self.on_report(self.store.get(report_key(seq)))
            elif not final and now - self.empty_slot_since[seq] < REPORT_SLOT_GRACE_S:
                return  # maybe a rank between counting and writing: look again at the next poll
            self.empty_slot_since.pop(seq, None)
            self.reports_seen = seq

    def drain_output(self) -> None:
        """Pass on the lines the ranks printed since the last call, each rank's in order."""
        if self.output is not None and self.ranks:
            self.output.drain([r.rank for r in self.ranks])

    def seen(self, records=(), job_error: Optional[BaseException] = None) -> Seen:
        """What this attempt saw, read from the store once the tasks are done."""
        store = self.store
        # Numbers a stranger or a killed task took without writing a signed value are skipped.
        failures = tuple(store.get(failure_key(i)) for i in range(1, store.counter(FAILURE_SEQ, 0) + 1)
                         if store.has(failure_key(i)))
        stacks = {r.rank: store.get(stack_key(r.rank)) for r in self.ranks if store.has(stack_key(r.rank))}
        return Seen(
            driver_host=self.config.driver_host, rendezvous_timeout=self.config.rendezvous_timeout,
            host_lost_timeout=self.config.host_lost_timeout, timeout=self.config.timeout, now=time.time(),
            tasks=tuple(self.tasks), ranks=tuple(self.ranks), failures=failures, stacks=stacks,
            records=tuple(records), timed_out=self.timed_out, lost_ranks=tuple(r.rank for r in self.lost_ranks),
            rendezvous_missing=tuple(self.rendezvous_missing), cancelled_here=self.cancelled,
            job_error=None if job_error is None else JobError(type(job_error).__name__, str(job_error)))
