"""The task side of a run: one barrier task (or one local-mode thread) serves its ranks: one, or one per GPU
of a multi-GPU task.

The Spark side (:func:`~spark_dist.task.partition.run_partition`, the barrier stage's ``mapInArrow``
function) hands its slots to :func:`serve_task`: it joins the run's store, publishes where they run, reads
their ranks, then runs the training code in a child process per rank (:mod:`spark_dist.task.child_process`:
forked from the reused Python worker in a Spark task, spawned in local mode) and supervises them.
The child is its own process group, dies with its parent (PR_SET_PDEATHSIG) and is killed by the supervisor
as soon as any rank's failure sets the run's abort key, so a rank blocked in a collective never hangs the run.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from typing import Any, Iterator, List, Optional

from . import checkpoint_dirs, flight_recorder, output, rank_stack, steps
from ..host import oom_kills, tempdirs
from ..errors import RankFailure
from ..wire.protocol import (ABORT, ARRIVED, FAILURES, HEARTBEAT_S, STACKS_WANTED, Abort, LaunchSpec, ResultChunk,
                             TaskOutcome, TaskStatus, assignment_key, beat_key, clock_key, ended_key, stall_stack_key,
                             stack_key, task_key)
from .child_process import ChildProcess
from .fence import Fence
from .rank_process import STACK_FILE, join_run_store
from ..wire.abort_watch import AbortWatch
from ..wire.ranks import RankInfo, TaskInfo, with_gloo_interface
from ..wire.sealed_store import SealedStore
from ..wire.store_log import StoreLog
from .warm_imports import IMPORTED_DYNAMO, warm_for_next_run

RESULT_CHUNK_BYTES = 8 << 20  # rank 0's result travels back in pieces of this size
RENDEZVOUS_BACKSTOP_S = 30.0  # a task's own rendezvous wait outlasts the driver's by this much
# A supervisor looks for a stall's request for stacks every this many beats (its round trip, which the fence counts):
# a stall is called after minutes, and at 1,024 ranks each look is a request a rank a second to the driver's store.
STACKS_LOOK_EVERY = 2
# A supervisor learns of the run's abort from its AbortWatch, woken by the store; it looks at the key this often
# only where the watch cannot wait (a forged value sits in the key, or the watch's connection failed).
ABORT_POLL_S = 0.2
STDERR_TAIL_BYTES = 16 << 10
# On a timeout, how long a supervisor waits for every rank's stack before it stops its own rank: the supervisors
# see the abort a loop turn apart (ABORT_POLL_S where one looks), and a rank stopped first would turn a peer's
# wait in a collective into an error of the peer's own (the connection closed) before the peer's stack was taken.
TIMEOUT_STACKS_S = 1.0


def serve_task(spec: LaunchSpec, slots: List[TaskInfo], start_child, in_executor: bool = False) -> Iterator[Any]:
    """Rendezvous, run a child per slot, and yield their records: :class:`ResultChunk` (rank 0 only), then
    one :class:`TaskStatus` per slot. ``in_executor``: also pass the ranks' output on to this process's own
    streams (the executor log, unless ``spec.executor_log`` says they are the driver's console); in local mode
    the driver shows the relayed lines, and nothing else."""
    store = join_run_store(spec)
    for slot in slots:
        store.put(task_key(slot.task_index), slot)
        store.counter(ARRIVED)  # after the value: the driver reads all tasks once the count says they came
    assignments = _assignments(store, spec, slots)
    if assignments is None:
        for slot in slots:
            yield TaskStatus(slot.task_index, TaskOutcome.ABORTED)
        return
    _preload(spec.backend)
    oom_before = oom_kills.count()  # before any child: a kill of the OOM killer from here on is one of theirs
    started = []  # (slot, rank, child, workdir)
    workdirs = []  # every work directory made, including one whose child failed to start
    supervised = False
    try:
        # Every child starts before any supervisor thread does: a fork while another thread holds a lock
        # (a stream's, the logging module's) would leave that lock held forever in the child.
        for slot, assignment in zip(slots, assignments):
            rank = assignment.rank
            env = with_gloo_interface(assignment.env, slot.host)
            workdirs.append(tempdirs.make("rank", f"{spec.run_id}-{spec.attempt}-r{rank.rank}"))
            steps.make_clock_file(workdirs[-1])
            started.append((slot, rank, start_child(spec, rank, env, workdirs[-1]), workdirs[-1]))
        outcomes = _supervise_all(started, store, spec, in_executor, oom_before)
        supervised = True
        checkpoint_dirs.remove_after_success(spec, store, outcomes)  # once the whole run succeeded
        for (slot, rank, _, workdir), outcome in zip(started, outcomes):
            if outcome is TaskOutcome.OK and (rank.rank == 0 or spec.every_result):
                result = _read_file(os.path.join(workdir, "result.pkl"))
                for chunk_no, start in enumerate(range(0, max(len(result), 1), RESULT_CHUNK_BYTES)):
                    yield ResultChunk(slot.task_index, chunk_no, result[start:start + RESULT_CHUNK_BYTES],
                                      rank.rank)
            yield TaskStatus(slot.task_index, outcome)
    finally:
        ranks_trained = any(os.path.exists(os.path.join(workdir, IMPORTED_DYNAMO)) for *_, workdir in started)
        if not supervised:  # a start failed (or supervision did): the children already running end here,
            for _, _, child, _ in started:  # reaped, so none is left a zombie of this long-lived worker
                child.kill()
                child.reap()
        for workdir in workdirs:
            tempdirs.remove(workdir)
        if in_executor and ranks_trained:
            warm_for_next_run()


def _assignments(store: SealedStore, spec: LaunchSpec, slots: List[TaskInfo]):
    """Each slot's :class:`~spark_dist.wire.protocol.SlotAssignment`, waited for on its own key (the store wakes
    the waiter); ``None`` when the driver aborted the rendezvous. The driver declares the rendezvous timeout
    (and names the tasks that never came); this wait is only a backstop should the driver be gone, so it
    must not win the race against the driver's abort."""
    deadline = time.monotonic() + spec.rendezvous_timeout + RENDEZVOUS_BACKSTOP_S
    assignments = []
    for slot in slots:
        assignment = store.wait_for(assignment_key(slot.task_index), max(deadline - time.monotonic(), 0.001))
        if assignment is None:
            return None
        assignments.append(assignment)
    return assignments


def serve_rank(spec: LaunchSpec, task: TaskInfo, start_child, in_executor: bool = False) -> Iterator[Any]:
    """:func:`serve_task` for a task of one slot."""
    return serve_task(spec, [task], start_child, in_executor)


def _supervise_all(started, store: SealedStore, spec: LaunchSpec, in_executor: bool,
                   oom_before: Optional[int] = None) -> List[TaskOutcome]:
    """Supervise the task's children together: a single child here, several in a thread each (each with its
    own store connection); their outcomes in order."""
    if len(started) == 1:
        _, rank, child, workdir = started[0]
        return [_supervise(child, store, spec, rank, workdir, in_executor, oom_before)]
    outcomes: List[Any] = [None] * len(started)

    def supervise(i):
        _, rank, child, workdir = started[i]
        try:
            outcomes[i] = _supervise(child, join_run_store(spec), spec, rank, workdir, in_executor, oom_before)
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, in the task's own thread
            outcomes[i] = exc

    threads = [threading.Thread(target=supervise, args=(i,), daemon=True) for i in range(len(started))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def _preload(backend: str) -> None:
    """Import the backend's module in this long-lived Python worker, so each forked rank starts with it."""
    if backend == "horovod":
        try:
            import horovod.torch  # noqa: F401
        except ImportError:
            pass  # the rank's own import reports it


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------------------------------------
# Supervision
# --------------------------------------------------------------------------------------------------------
_ABORT_REPORT_GRACE_S = 0.5


def _supervise(child: ChildProcess, store: SealedStore, spec: LaunchSpec, rank: RankInfo,
               workdir: str, in_executor: bool = True, oom_before: Optional[int] = None) -> TaskOutcome:
    """Wait for the child; kill it when the run aborts (first dumping its stack when the run timed out);
    report its failure. Relays its output lines to the driver meanwhile (see :mod:`spark_dist.task.output`).
    ``oom_before``: the OOM kills counted in this process's memory cgroup before the child started."""
    # Lines are buffered and published only when the driver shows them; the stderr tail always stays.
    lines = output.LineBuffer() if output.relays(spec.relay_output, rank.rank) else None

    def log(stream):
        return getattr(stream, "buffer", None) if in_executor and spec.executor_log else None

    tail = output.StreamReader(child.stderr_fd, "stderr", lines, log(sys.stderr), tail_bytes=STDERR_TAIL_BYTES)
    readers = [tail, output.StreamReader(child.stdout_fd, "stdout", lines, log(sys.stdout))]
    for reader in readers:
        reader.start()
    publisher = output.Publisher(store, rank.rank, lines) if lines is not None else None
    exit_code = []
    waiter = threading.Thread(target=lambda: exit_code.append((child.wait(), time.time())), daemon=True)
    waiter.start()
    watch = AbortWatch(lambda: join_run_store(spec), ABORT_POLL_S)  # its own connection: the wait blocks it
    aborted = False
    poll = 0.005
    next_beat, beats, stacks_sent, next_abort = 0.0, 0, 0, 0.0
    clock = steps.ClockReader(os.path.join(workdir, steps.CLOCK_FILE))
    fence = Fence(spec.host_lost_timeout, child.kill,
                  f"rank {rank.rank}'s supervisor (the store at {spec.store_host}:{spec.store_port})")
    fence.start()
    stack_path = os.path.join(workdir, STACK_FILE)
    try:
        while waiter.is_alive():
            waiter.join(poll)
            poll = min(poll * 2, 0.05)
            if time.monotonic() >= next_beat:  # the driver tells a lost host by its ranks' silence
                # Sealed and rising: only a higher number than the driver saw counts, so a peer can neither
                # forge a beat nor replay an old one to keep a dead host looking alive. With it, the rank's
                # step count: the driver tells a stall by counts that stopped while the beats go on.
                beats += 1
                store.put(beat_key(rank.rank), (beats, clock.count()))
                next_beat = time.monotonic() + HEARTBEAT_S
                wanted = store.lookup(STACKS_WANTED, 0) if beats % STACKS_LOOK_EVERY == 1 else None
                if wanted is not None:
                    fence.reached()  # after a round trip: a put is only sent, the answer to a lookup came back
                if isinstance(wanted, int) and wanted > stacks_sent:  # the driver diagnoses a stall
                    stacks_sent = wanted
                    stack = rank_stack.dump(child.pid, stack_path)
                    trace = flight_recorder.ask(workdir) if spec.use_gpu else None
                    store.put(stall_stack_key(rank.rank), (wanted, stack, trace))
            if publisher is not None:
                publisher.publish()
            abort = watch.value if waiter.is_alive() else None
            if abort is None and not watch.live and waiter.is_alive() and time.monotonic() >= next_abort:
                next_abort = time.monotonic() + ABORT_POLL_S  # the watch could not wait: look, as it would have
                abort = store.lookup(ABORT)
            if abort is not None:
                aborted = True
                if abort == Abort.TIMEOUT:
                    store.put(stack_key(rank.rank), rank_stack.dump(child.pid, stack_path))
                    _await_stacks(store, rank.world_size)
                elif abort != Abort.CANCELLED:  # the caller gave up: no rank's report is wanted
                    # A rank that raised at about the same time as the one that aborted the run is writing
                    # its own report: let it finish, or "every rank raised the same error" (not retried)
                    # would look like one rank's error (retried). A rank blocked in a collective waits it out.
                    waiter.join(_ABORT_REPORT_GRACE_S)
                    # A rank that ended by itself meanwhile (killed by a signal, say) may be the root cause,
                    # its peer's failure only the echo that set the abort first: its end is reported as is.
                    aborted = waiter.is_alive()
                child.kill()
                waiter.join()
    except BaseException:  # the driver (and its store) went away, or this task is being killed
        aborted = True
        child.kill()
        waiter.join()
    watch.close()  # left waiting: the store's host releases it (spark_dist.wire.abort_watch.release)
    fence.ended.set()
    child.kill()  # what the rank started and left running (a loader's workers, a server) ends with it
    if publisher is not None and not fence.fenced:  # the pipes' last lines (also those printed before a SIGKILL)
        publisher.flush(readers)  # (cut off, they could not reach the driver: they stay in the executor log)
    for reader in readers:
        reader.join(timeout=2.0)
    if fence.fenced:  # cut off from the driver, which went on without this host: nothing to report, nor a way to
        clock.close()
        return TaskOutcome.ABORTED
    try:
        try:  # the rank's clock as it left it (also when it was killed): the driver splits the run's time with it
            store.put(clock_key(rank.rank), clock.read())
        except Exception:  # noqa: BLE001 -- the driver's store may be gone already
            pass
        clock.close()
        return _conclude(store, rank, workdir, exit_code[0], aborted, tail, oom_before)
    finally:
        # The last write: under Spark Connect the first task stops watching (and drops the store) once every
        # rank has ended, so the failure report must be in the store before this.
        try:
            store.put(ended_key(rank.rank), True)  # no more beats: ended, not lost
        except Exception:  # noqa: BLE001 -- the driver's store may be gone already
            pass


def _await_stacks(store: SealedStore, world_size: int, bound: float = TIMEOUT_STACKS_S) -> None:
    """Until every rank's stack is in the store (or ``bound`` seconds passed: a rank that had ended has none)."""
    keys = [store.key(stack_key(r)) for r in range(world_size)]
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and not store.raw.check(keys):
        time.sleep(0.02)


def _conclude(store: SealedStore, rank: RankInfo, workdir: str, exit_code, aborted: bool,
              tail: output.StreamReader, oom_before: Optional[int] = None) -> TaskOutcome:
    """The rank's outcome from how its process ended; a failure is reported (and the run aborted) here.
    ``oom_before``: the OOM kills counted in this process's memory cgroup as the rank started, which tells a
    SIGKILL of the OOM killer from any other."""
    code, ended = exit_code
    failure_path = os.path.join(workdir, "failure.pkl")
    if code == 0 and not aborted:
        return TaskOutcome.OK
    if not aborted and not os.path.exists(failure_path) and os.path.exists(os.path.join(workdir, "result.pkl")):
        # The rank delivered its result and then crashed on its way out (a library's exit handler, gloo
        # torn down at interpreter shutdown: SIGABRT): the training is done, so say so and keep it.
        sys.stderr.write(f"spark_dist: WARNING: rank {rank.rank} exited with "
                         f"{'signal ' + str(-code) if code < 0 else 'code ' + str(code)} after delivering its "
                         f"result; the result is kept. Its last output:\n{tail.text()[-2000:]}\n")
        return TaskOutcome.OK
    if aborted and not os.path.exists(failure_path):  # a rank that had raised by itself still reports it
        return TaskOutcome.ABORTED
    if os.path.exists(failure_path):
        failure: RankFailure = pickle.loads(_read_file(failure_path))
    elif code < 0:
        oom_after = oom_kills.count() if -code == signal.SIGKILL and oom_before is not None else None
        failure = RankFailure(rank.rank, rank.host, "signal", f"killed by signal {-code}", signal=-code,
                              traceback=tail.text()[-4000:], time=ended,
                              oom_killed=None if oom_after is None else oom_after > oom_before)
    else:
        failure = RankFailure(rank.rank, rank.host, "exit", "the rank process exited unexpectedly",
                              exit_code=code, traceback=tail.text()[-4000:], time=ended)
    StoreLog(store, FAILURES, writer=f"supervisor{rank.rank}").append(failure)
    store.put(ABORT, Abort.RANK_FAILED)
    return TaskOutcome.FAILED
