"""What an attempt's end means: rank 0's result or the failures to report, and whether to try again.

Pure functions of what the attempt saw (:class:`AttemptEvidence`): the launcher gathers it once the job has ended, and
the rules here are tested with tables of cases (``tests/test_outcome.py``). The order of the rules is the
order of causes: a timeout explains everything after it; a host that went silent explains what its peers
reported; the driver's rendezvous timeout explains what the tasks did after its abort; then what the ranks
reported, with the Spark job's own failure leading when the ranks only echo it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..config import CONF_HOST_LOST_TIMEOUT, CONF_RENDEZVOUS_TIMEOUT, CONF_STORE_PORT
from ..errors import RankFailure, root_cause
from ..wire.protocol import NO_STACK, STOPPED, ResultChunk
from ..wire.ranks import RankInfo, TaskInfo


@dataclass(frozen=True)
class JobError:
    """The Spark job's own failure (a lost executor, a killed task, a cancelled job), as text."""

    type_name: str
    text: str


@dataclass(frozen=True)
class AttemptEvidence:
    """What one attempt saw, gathered once its job has ended."""

    driver_host: str
    rendezvous_timeout: float
    host_lost_timeout: float
    timeout: Optional[float] = None
    now: float = 0.0                              # wall-clock time of the decision (failure times)
    tasks: Tuple[TaskInfo, ...] = ()              # where each task ran, by task index (once all had come)
    ranks: Tuple[RankInfo, ...] = ()              # each task's rank, by task index (once assigned)
    failures: Tuple[RankFailure, ...] = ()        # what the ranks reported, numbered as they reported
    stacks: Mapping[int, str] = field(default_factory=dict)  # rank -> stack dumped after the timeout
    records: Tuple[Any, ...] = ()                 # what the job returned: ResultChunk and TaskStatus
    timed_out: bool = False                       # the driver aborted on ``timeout``
    lost_ranks: Tuple[int, ...] = ()              # ranks on hosts whose heartbeats lapsed
    rendezvous_missing: Tuple[int, ...] = ()      # tasks that never reached the store in time
    job_error: Optional[JobError] = None
    cancelled_here: bool = False                  # spark_dist itself cancelled the job (abort grace, lost host)
    store_port: int = 0                           # where the run's store listened, on driver_host (0: unknown)
    store_in_task: bool = False                   # the first task hosted the store (Spark Connect), not the driver
    stalled: Any = None                           # the StallDiagnosis that ended the run (stallAction=fail)
    clocks: Mapping[int, dict] = field(default_factory=dict)  # rank -> its clock as it ended (task/steps.py)
    failed_at: Optional[float] = None             # time.time() when the attempt was aborted (None: it was not)


@dataclass(frozen=True)
class Outcome:
    """Rank 0's pickled result (with ``LaunchSpec.every_result``, every rank's: ``rank_results``), or the
    failures to report (root cause first)."""

    result_bytes: Optional[bytes] = None
    failures: Optional[List[RankFailure]] = None
    timed_out: bool = False
    rank_results: Optional[Dict[int, bytes]] = None
    stalled: bool = False  # timed out by spark.dist.stallAction=fail, not by timeout=


def outcome_of(seen: AttemptEvidence) -> Outcome:
    """The attempt's outcome. Each failure's ``seq`` orders it for :func:`~spark_dist.errors.root_cause`."""
    seen = _on_driver(seen)
    if seen.timed_out:
        return Outcome(failures=_timed_out(seen), timed_out=True)
    if seen.stalled is not None:
        return Outcome(failures=_stalled(seen), timed_out=True, stalled=True)
    if seen.lost_ranks:  # the silent host is the root cause; what its peers reported follows from it
        lost = [_rank_failure(seen, rank, f"host {seen.ranks[_task_of(seen, rank)].host} went silent: no "
                              f"heartbeat from its ranks for {seen.host_lost_timeout:g}s ({CONF_HOST_LOST_TIMEOUT}); "
                              "it may be off the network or its executor frozen", seq=i + 1)
                for i, rank in enumerate(seen.lost_ranks)]
        return Outcome(failures=lost + _after(seen.failures, len(lost), skip=set(seen.lost_ranks)))
    # The driver declared the rendezvous timeout: what the tasks did after its abort (a task's own backstop
    # timeout, a cancelled job) follows from it, so the documented error leads, not a "lost" task.
    if seen.rendezvous_missing:
        return Outcome(failures=[_rendezvous_failure(seen)])
    failures = list(seen.failures)
    if seen.job_error is not None and not seen.cancelled_here and _CANCELLED.search(seen.job_error.text):
        # Someone cancelled the run's job (the Spark UI's kill link, its job group or tag): not a failure
        # to retry. What the ranks reported as they were stopped follows.
        return Outcome(failures=[RankFailure(
            None, seen.driver_host, "cancelled", "the run's Spark job was cancelled (from the Spark UI, or by "
            "its job group or tag)", exc_type=seen.job_error.type_name, seq=1, time=seen.now)]
            + _after(failures, 1))
    if seen.job_error is not None and all(f.secondary for f in failures):
        # A rank whose worker died reports nothing itself; its peers only saw the connection drop.
        lost = lost_task_failures(seen)
        return Outcome(failures=lost + _after(failures, len(lost), skip={f.rank for f in lost}))
    if failures:
        return Outcome(failures=failures)
    by_rank: Dict[int, List[Tuple[int, bytes]]] = {}
    for r in seen.records:
        if isinstance(r, ResultChunk):
            by_rank.setdefault(r.rank, []).append((r.chunk_no, r.data))
    if 0 not in by_rank:
        return Outcome(failures=[RankFailure(
            None, seen.driver_host, "lost", "the Spark job ended without rank 0's result and no rank reported a "
            f"failure (task outcomes: {_statuses(seen.records) or 'none'})", time=seen.now)])
    joined = {rank: b"".join(data for _, data in sorted(chunks)) for rank, chunks in by_rank.items()}
    return Outcome(result_bytes=joined[0], rank_results=joined if len(joined) > 1 else None)


def _on_driver(seen: AttemptEvidence) -> AttemptEvidence:
    """``seen`` with its failures marked ``on_driver`` when the ranks ran on the driver (local mode: no slot
    has an executor, and all are Spark task 0, see :class:`~spark_dist.wire.ranks.TaskInfo`), so that a SIGKILL
    points to the driver's machine's memory rather than an executor's."""
    if not seen.tasks or any(t.executor or t.spark_task != 0 for t in seen.tasks):
        return seen
    return dataclasses.replace(seen, failures=tuple(dataclasses.replace(f, on_driver=True) for f in seen.failures))


def _timed_out(seen: AttemptEvidence) -> List[RankFailure]:
    """The ranks asked for their stacks: a stopped one first (the one its peers wait for), then one that did not
    answer (stuck outside Python, or slow on a loaded host), then in rank order; reports after the abort only
    for the others."""
    message = f"the run exceeded timeout={seen.timeout:g}s"
    asked = sorted((r for r in seen.ranks if r.rank in seen.stacks),
                   key=lambda r: (_silence(seen.stacks[r.rank]), r.rank))
    hung = [RankFailure(r.rank, r.host, "timeout", _with_why(message, seen.stacks[r.rank]),
                        traceback=seen.stacks[r.rank], seq=n + 1) for n, r in enumerate(asked)]
    # Whatever a rank reported after the timeout's abort echoes it (an all-reduce that lost the rank we
    # stopped first): the stacks lead, and such a report stands only for a rank without one.
    echoes = _after(seen.failures, len(seen.ranks) + 1, skip=set(seen.stacks))
    return hung + echoes or [RankFailure(
        None, seen.driver_host, "timeout",
        message + (" while the ranks were starting" if seen.ranks else " before every rank started"))]


def _stalled(seen: AttemptEvidence) -> List[RankFailure]:
    """The stall's ranks, those behind first, each with its stack; then what the others reported after the
    abort, for a rank without a stack only."""
    diagnosis = seen.stalled
    message = diagnosis.headline()
    ordered = sorted(diagnosis.ranks, key=lambda r: (r.rank not in diagnosis.behind, r.rank))
    stuck = [RankFailure(r.rank, r.host, "stalled", f"{message}; it waits in {r.frame}"
                         + (f", from {r.own_frame}" if r.own_frame else ""), traceback=r.stack, seq=n + 1,
                         time=seen.now) for n, r in enumerate(ordered)]
    return stuck + _after(seen.failures, len(stuck) + 1, skip={r.rank for r in ordered})


def _silence(stack: str) -> int:
    """0: the process was stopped; 1: it gave no stack in time; 2: it gave one."""
    if not stack.startswith(NO_STACK):
        return 2
    return 0 if STOPPED in stack else 1


def _with_why(message: str, stack: str) -> str:
    return f"{message}; {stack[len(NO_STACK):].rstrip(')')}" if stack.startswith(NO_STACK) else message


def _rendezvous_failure(seen: AttemptEvidence) -> RankFailure:
    store = f"{seen.driver_host}:{seen.store_port}" if seen.store_port else seen.driver_host
    # Tasks that ran but could not connect look the same as tasks that never ran: say what to check for both.
    if seen.store_in_task:
        address = ("the address is the first task's executor host, where the store lives under Spark Connect: "
                   "executors must reach each other")
    else:
        address = ("the address is spark.driver.host (the driver binds spark.driver.bindAddress where that is "
                   "set): it must be one the executors can reach, not a loopback or NAT-internal address")
    return RankFailure(
        None, seen.driver_host, "timeout",
        f"the ranks did not all start within {CONF_RENDEZVOUS_TIMEOUT}={seen.rendezvous_timeout:g}s "
        f"(tasks that never reached the run's store at {store}: {', '.join(map(str, seen.rendezvous_missing))}). "
        f"If they ran, check that every executor can reach {store}: a firewall between them blocks it unless "
        f"the port is open (pin it with {CONF_STORE_PORT}, a port or a range, and open that); {address}",
        time=seen.now)


def _after(failures: Sequence[RankFailure], offset: int, skip=frozenset()) -> List[RankFailure]:
    """``failures`` (but those of ranks in ``skip``) numbered after ``offset`` leading ones."""
    return [dataclasses.replace(f, seq=offset + (f.seq or 0)) for f in failures if f.rank not in skip]


def _task_of(seen: AttemptEvidence, rank: int) -> int:
    return next(i for i, r in enumerate(seen.ranks) if r.rank == rank)


def _rank_failure(seen: AttemptEvidence, rank: int, message: str, seq: int, **extra) -> RankFailure:
    return RankFailure(rank, seen.ranks[_task_of(seen, rank)].host, "lost", message, seq=seq, time=seen.now,
                       **extra)


def _statuses(records) -> str:
    return ", ".join(f"task {r.task_index} {r.outcome.value}" for r in records if hasattr(r, "outcome"))


_CANCELLED = re.compile(r"cancelled part of cancelled job group|cancelled as part of cancellation|"
                        r"OPERATION_CANCELED|killed via the Web UI|Job \d+ cancelled", re.IGNORECASE)
_PYTHON_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit): ")
_BARRIER_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_LOST = re.compile(r"(Python worker exited unexpectedly[^\n]*|ExecutorLostFailure[^\n]*)")


def _task_traceback(text: str, limit: int = 4000) -> str:
    """A failed Spark task's traceback: the Python one in Spark's text when there is one (from its first line to
    the exception's, without the JVM's frames after it), else the last ``limit`` characters from a line's start."""
    start = text.find("Traceback (most recent call last):")
    if start >= 0:
        lines = text[start:].splitlines()
        end = next((i for i, line in enumerate(lines) if i and _PYTHON_ERROR.match(line)), len(lines) - 1)
        return "\n".join(lines[:end + 1])[-limit:]
    tail = text.rstrip("\n")[-limit:]
    return tail[tail.find("\n") + 1:] if len(text.rstrip("\n")) > limit and "\n" in tail else tail


def lost_task_failures(seen: AttemptEvidence) -> List[RankFailure]:
    """The Spark job failed with no rank report of its own (executor lost, task killed, the task's Python
    failed before its rank started). Name the rank of the failed barrier task when Spark says which it was,
    and when Spark lost its whole executor, every rank that executor ran; lead with the Python error if there
    is one, else Spark's own reason."""
    assert seen.job_error is not None
    text = seen.job_error.text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    python_errors = [line for line in lines if _PYTHON_ERROR.match(line)
                     and not line.startswith(("org.apache", "py4j", "java."))]
    spark_reason = next((line for line in lines if "Exception" in line or "lost" in line.lower()),
                        lines[0] if lines else seen.job_error.type_name)
    reason = python_errors[0] if python_errors else spark_reason
    lost = _LOST.search(text)
    if lost and not python_errors:
        reason = lost.group(1)
    if "No module named 'spark_dist'" in reason or "No module named 'torch'" in reason:
        reason += (" (the executors' Python lacks spark_dist's packages: set PYSPARK_PYTHON or "
                   "spark.executorEnv.PYSPARK_PYTHON to a Python that has spark_dist installed)")
    details = dict(exc_type=seen.job_error.type_name, traceback=_task_traceback(text))
    task = _BARRIER_TASK.search(text)
    failed = int(task.group(1)) if task else None
    # The failed Spark task's process slots (one, or one per GPU of a multi-GPU task).
    slots = [] if failed is None else [i for i, t in enumerate(seen.tasks[:len(seen.ranks)])
                                       if t.partition == failed]
    if not slots:
        # No rank known for it (under Spark Connect the task-to-rank map is the first task's, gone with the
        # stage): name the barrier task, and its executor when Spark does.
        executor = re.search(r"\(executor (\S+?)[ )]", text)
        where = f"executor {executor.group(1)}" if executor else seen.driver_host
        which = f" (barrier task {failed})" if failed is not None else ""
        return [RankFailure(None, where, "lost", f"its Spark task{which} failed: {reason[:500]}", seq=1,
                            time=seen.now, **details)]
    executor = seen.tasks[slots[0]].executor
    if executor and lost and lost.group(1).startswith("ExecutorLostFailure"):
        # Every task of a lost executor died with it; Spark names only the one that failed the stage.
        slots = [i for i, t in enumerate(seen.tasks) if t.executor == executor]
        what = f"its executor {executor} was lost"
    else:
        what = "its Spark task failed"
    return [_rank_failure(seen, seen.ranks[i].rank, f"{what}: {reason[:500]}", seq=n + 1, **details)
            for n, i in enumerate(sorted(slots, key=lambda i: seen.ranks[i].rank))]


# -- retry rules --------------------------------------------------------------------------------------------
# Failures that would happen again on every attempt: a module missing on the executors, a result too big.
DETERMINISTIC = frozenset({"ModuleNotFoundError", "ImportError", "spark_dist.task.result.ResultTooLargeError",
                           "spark_dist.errors.ConfigError"})


def _digits_masked(message: str) -> str:
    return re.sub(r"\d+", "#", message)


def worth_retrying(failures: List[RankFailure], world_size: int, previous: List[RankFailure]) -> bool:
    """Retry a lost task, a killed process, or an exception on some ranks; not an exception that every rank
    raised alike, nor the same root-cause exception as the attempt before (a bug in the code fails again),
    nor a rank out of memory (it would ask for as much again), nor a job someone cancelled."""
    raised = [f for f in failures if f.kind == "exception" and not f.secondary]
    if any(f.exc_type in DETERMINISTIC or f.out_of_memory for f in raised) or any(
            f.kind == "cancelled" for f in failures):
        return False
    # Alike: the same type and message but for numbers (a rank, a shape, an address differs per rank).
    if len(raised) >= world_size and len({(f.exc_type, _digits_masked(f.message)) for f in raised}) == 1:
        return False
    if previous:
        now, before = root_cause(failures), root_cause(previous)
        if now.kind == before.kind == "exception" and (now.exc_type, now.message) == (before.exc_type, before.message):
            return False
    return True
