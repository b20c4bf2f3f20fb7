"""One attempt from a Spark Connect session: no SparkContext, and a client the executors may not reach.

The launch is a barrier job through the DataFrame API (``spark.range(n).mapInArrow(..., barrier=True)``, as
PySpark's TorchDistributor does under Connect), started under a job tag and cancelled by it. The run's store
cannot live on the client, so the first task hosts it and runs the :class:`~spark_dist.driver.coordinator.Coordinator`
next to its own rank. The other tasks find it without a barrier sync (``allGather`` costs a second): its host
is the first task's executor host (``getTaskInfos``, static) and its port the one the client drew for the
attempt (from ``spark.dist.storePort`` when set, for a firewall that opens only those). A port that turns
out taken there fails the first task with a marked error, and the client relaunches the attempt on another
port (not counted as a retry).

What comes back: every task's records (rank 0's result chunks, each task's status) and, from the first task,
what its coordinator saw (:class:`Watched`: the reports and failures, for :func:`~spark_dist.driver.outcome.outcome_of`).
The ranks' ``ctx.report`` records and printed lines reach the client with it, at the end of the attempt: Connect has no channel
from executors to the client while a job runs. A host that went silent would keep the job from ending, so
the first task then fails the stage on purpose, carrying what it saw in its error (:data:`VERDICT`).
"""
from __future__ import annotations

import base64
import dataclasses
import errno
import functools
import hashlib
import hmac
import os
import pickle
import random
import re
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

from ..task import checkpoint_dirs, output
from ..spark import session
from ..config import CONF_STORE_PORT, RunConfig
from ..errors import ConfigError
from .outcome import JobError, Outcome, Seen, outcome_of
from ..wire.protocol import ABORT, Abort, LaunchSpec, TaskOutcome, TaskStatus
from ..wire.signed_store import SignedStore, bind_listener, host_store

VERDICT = "spark_dist-verdict"  # brackets what the first task saw, in the error that fails the stage
PORT_TAKEN = "spark_dist-store-port-taken"
STORE_PORTS = (20000, 32000)  # below Linux's ephemeral range, so outgoing connections rarely hold one
_PORT_ATTEMPTS = 4
_TAKEN_AT = re.compile(re.escape(PORT_TAKEN) + r": port \d+ on (\S+): ")


def ports_to_try(configured: Optional[Tuple[int, int]], draw: random.Random) -> List[int]:
    """The store ports the client tries for one attempt, in order: up to ``_PORT_ATTEMPTS`` distinct ones
    drawn from ``spark.dist.storePort``'s range (``(first, last)``, both included) when set, else from
    :data:`STORE_PORTS`. Drawn, not taken in order: the client cannot see which are free on the executor,
    and concurrent runs would otherwise all try the first port first."""
    first, last = configured or (STORE_PORTS[0], STORE_PORTS[1] - 1)
    return draw.sample(range(first, last + 1), min(_PORT_ATTEMPTS, last - first + 1))


def configured_ports_taken(ports: Tuple[int, int], tried: List[int], error_text: str) -> ConfigError:
    """The error for a run whose every drawn ``spark.dist.storePort`` port was taken on the first task's
    executor (``error_text``: the task's marked error, which names the host)."""
    found = _TAKEN_AT.search(error_text)
    where = f"on {found.group(1)} " if found else ""
    first, last = ports
    if first == last:
        return ConfigError(f"{CONF_STORE_PORT}={first}: port {first} is taken {where}(the first task's executor, "
                           "which hosts the run's store under Spark Connect); with a single port no redraw can "
                           f"help: free it, or give a range (for example {first}-{min(first + 100, 65535)})")
    return ConfigError(f"{CONF_STORE_PORT}={first}-{last}: ports {', '.join(map(str, tried))} were all taken "
                       f"{where}(the first task's executor, which hosts the run's store under Spark Connect); "
                       "widen the range")


@dataclass(frozen=True)
class Watched:
    """What the first task's coordinator saw, and the reports it relayed."""

    seen: Seen
    reports: tuple
    output: tuple = ()  # (rank, stream, line): the tail of what each rank printed (output.OutputTail)


class ConnectAttempt:
    """The client side of one attempt (see the module docstring); ``run()`` returns its outcome."""

    def __init__(self, owner, config: RunConfig, backend, job_bytes: bytes, attempt: int, handles,
                 checkpoint_dir: str, spark, time_left: Optional[float]):
        self.owner, self.config, self.spark = owner, config, spark
        self.time_left = time_left
        self.tag = f"spark_dist-{config.run_id}-{attempt}"
        self.spec = LaunchSpec(
            run_id=config.run_id, attempt=attempt, store_host="", store_port=0, job_bytes=job_bytes,
            secret=os.urandom(32), use_gpu=config.use_gpu, rendezvous_timeout=config.rendezvous_timeout,
            checkpoint_dir=checkpoint_dir, datasets=handles, collective_timeout=config.collective_timeout,
            backend=config.backend, max_result_bytes=config.max_result_bytes,
            processes_per_task=config.processes_per_task, relay_output=owner.log_ranks,
            remove_checkpoint_dir=checkpoint_dirs.removed_after_success(config))

    def run(self) -> Outcome:
        """The attempt's outcome.

        Raises:
            ConfigError: naming ``spark.dist.storePort``: every port drawn from it was taken.
        """
        started = time.monotonic()
        tried = ports_to_try(self.config.store_ports, random.SystemRandom())
        for port in tried:
            spec = dataclasses.replace(self.spec, store_port=port)
            time_left = None if self.time_left is None else self.time_left - (time.monotonic() - started)
            records, error, timed_out = self._job(spec, time_left)
            if error is None or PORT_TAKEN not in str(error):
                break
        else:
            if self.config.store_ports is not None:
                raise configured_ports_taken(self.config.store_ports, tried, str(error))
        return self._outcome(records, error, timed_out, port)

    def _job(self, spec: LaunchSpec, time_left: Optional[float]):
        n = self.config.num_tasks
        # The tasks need the run's settings, not the session's whole conf (which may hold credentials).
        config = dataclasses.replace(self.config, spark_conf={})
        task = functools.partial(run_connect_partition, spec, config, time_left)
        frame = self.spark.range(0, n, 1, n).mapInArrow(task, session.RECORDS_SCHEMA, barrier=True)
        rows: List[Any] = []
        errors: List[BaseException] = []
        done = threading.Event()

        def collect():
            self.spark.addTag(self.tag)  # tags belong to the thread that starts the operation
            ours = self.config.job_description(spec.attempt)
            described = _describe_jobs(self.spark, ours)
            try:
                rows.extend(frame.collect())
            except BaseException as exc:  # a lost executor, a failed stage, an interrupt
                errors.append(exc)
            finally:
                self.spark.removeTag(self.tag)
                if described:
                    _undescribe_jobs(self.spark, ours)
                done.set()

        thread = threading.Thread(target=collect, name=self.tag, daemon=True)
        thread.start()
        # The first task enforces the timeout itself (and dumps the ranks' stacks); the client interrupts
        # only if the job outlives it by the abort grace and a margin for the stage's end.
        limit = None if time_left is None else max(time_left, 0.0) + self.config.abort_grace_period + 30
        timed_out = False
        try:
            if not done.wait(limit):
                timed_out = True
                session.cancel(self.spark, self.tag)
                done.wait(60)
        except BaseException:  # Ctrl-C on the client: the job goes, and its tasks with their ranks
            session.cancel(self.spark, self.tag)
            thread.join(60)
            raise
        records = session.records_of(rows)
        return records, (errors[0] if errors else None), timed_out

    def _outcome(self, records, error: Optional[BaseException], timed_out: bool, store_port: int) -> Outcome:
        watched = next((r for r in records if isinstance(r, Watched)), None)
        if watched is None and error is not None:
            watched = verdict_in(str(error), self.spec.secret)
            error = None if watched is not None else error
        if watched is None:
            seen = Seen(driver_host=self.config.driver_host, rendezvous_timeout=self.config.rendezvous_timeout,
                        host_lost_timeout=self.config.host_lost_timeout, timeout=self.config.timeout,
                        now=time.time(), timed_out=timed_out)
        else:
            seen = watched.seen
            for report in watched.reports:
                self.owner._on_report(report)
            show = output.printer(self.owner.log_ranks)
            for line in watched.output if show is not None else ():
                show(*line)
        job_error = None if error is None else JobError(type(error).__name__, str(error))
        return outcome_of(dataclasses.replace(
            seen, records=tuple(r for r in records if not isinstance(r, Watched)), job_error=job_error,
            store_port=store_port, store_in_task=True))


def _describe_jobs(spark, description: str) -> bool:
    """Name the run's job in the Spark UI (``spark.job.description``, a session-wide setting under Connect)
    unless the user set a description of their own, which is theirs to keep; returns whether ours was set."""
    try:
        if spark.conf.get("spark.job.description", None):
            return False
        spark.conf.set("spark.job.description", description)
        return True
    except Exception:  # noqa: BLE001 -- only the UI's label
        return False


def _undescribe_jobs(spark, description: str) -> None:
    """Unset our description, unless someone replaced it meanwhile."""
    try:
        if spark.conf.get("spark.job.description", None) == description:
            spark.conf.unset("spark.job.description")
    except Exception:  # noqa: BLE001 -- the session may be gone
        pass


def verdict(watched: Watched, secret: bytes) -> str:
    """``watched`` as text for an error message, signed with the attempt's secret like every store value."""
    payload = base64.b64encode(zlib.compress(pickle.dumps(watched))).decode()
    return f"{VERDICT}<{payload}.{hmac.new(secret, payload.encode(), hashlib.sha256).hexdigest()}>"


def verdict_in(text: str, secret: bytes) -> Optional[Watched]:
    """What the first task saw, from the error with which it failed the stage on purpose (``None`` when the
    text holds none, or one not signed with ``secret``: it is never unpickled then)."""
    found = re.search(re.escape(VERDICT) + r"<([A-Za-z0-9+/=]+)\.([0-9a-f]{64})>", text)
    if not found:
        return None
    expected = hmac.new(secret, found.group(1).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, found.group(2)):
        return None
    return pickle.loads(zlib.decompress(base64.b64decode(found.group(1))))


# --------------------------------------------------------------------------------------------------------
# In the tasks
# --------------------------------------------------------------------------------------------------------
def run_connect_partition(spec: LaunchSpec, config: RunConfig, time_left: Optional[float],
                          batches) -> Iterator[Any]:
    """``mapInArrow`` function of the barrier stage: serve this task's rank (the first task also hosts the
    store and the coordinator); yield its records as one Arrow batch of pickles."""
    from pyspark import BarrierTaskContext

    from ..task.barrier_task import fork_child, serve_task, task_slots

    for _ in batches:  # the input rows only made the tasks
        pass
    context = BarrierTaskContext.get()
    slots = task_slots(context, spec)
    index = context.partitionId()
    spec = dataclasses.replace(spec, store_host=context.getTaskInfos()[0].address.rsplit(":", 1)[0])
    if index == 0:
        records = _serve_with_coordinator(spec, config, time_left,
                                          lambda: serve_task(spec, slots, fork_child, in_executor=True))
    else:
        try:
            records = list(serve_task(spec, slots, fork_child, in_executor=True))
        except Exception as exc:  # noqa: BLE001 -- the first task's store unreachable from here
            # Failing the stage would throw away what the first task saw (it names the tasks that never came
            # as the rendezvous timeout); end this task and let its verdict speak.
            sys.stderr.write(f"spark_dist: task {index} could not serve its ranks through the store at "
                             f"{spec.store_host}:{spec.store_port}: {exc!r}\n")
            records = [TaskStatus(slot.task_index, TaskOutcome.ABORTED) for slot in slots]
    yield session.records_batch(records)


def _serve_with_coordinator(spec: LaunchSpec, config: RunConfig, time_left: Optional[float], serve) -> List[Any]:
    """Host the store and run the coordinator beside ``serve()`` (this task's own rank); its records plus
    what the coordinator saw."""
    from ..backends import get_backend
    from .coordinator import Coordinator

    try:
        listener = bind_listener(spec.store_host, spec.store_port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # the client relaunches on another port
            raise RuntimeError(f"{PORT_TAKEN}: port {spec.store_port} on {spec.store_host}: {exc}") from None
        raise RuntimeError(f"spark_dist: the first task cannot listen on {spec.store_host} (its executor's "
                           f"address as Spark knows it): {exc}") from exc
    server, _ = host_store(spec.store_host, spec.rendezvous_timeout, listener)
    store = SignedStore(server, spec.secret, spec.prefix)
    backend = get_backend(config.backend, config)
    reports: List[dict] = []
    lines = output.OutputTail()  # the client gets the lines only at the end: a bounded tail of each rank's
    give_up = threading.Event()
    deadline = None if time_left is None else time.monotonic() + max(time_left, 0.0)
    config = dataclasses.replace(config, driver_host=spec.store_host)
    # No Spark job to wait for here: the watch ends once every rank has ended, or on give_up.
    coordinator = Coordinator(store, config, spec, backend, job_ended=None, cancel=give_up.set,
                              on_report=reports.append, deadline=deadline, host=spec.store_host,
                              on_output=lines)
    crashed: List[BaseException] = []

    def watch():
        try:
            coordinator.watch(give_up.wait)
        except BaseException as exc:  # noqa: BLE001 -- e.g. the backend cannot start here: stop every rank
            crashed.append(exc)
            give_up.set()
            try:
                store.put(ABORT, Abort.CANCELLED)
            except Exception:  # noqa: BLE001
                pass

    watcher = threading.Thread(target=watch, daemon=True, name="spark_dist-coordinator")
    watcher.start()
    try:
        records = list(serve())
        watcher.join()
        if crashed:  # the stage fails with the real cause
            raise RuntimeError(f"spark_dist: the run's coordinator failed in the first task: {crashed[0]!r}") \
                from crashed[0]
        coordinator.drain_reports(final=True)
        coordinator.drain_output(final=True)
        watched = Watched(coordinator.seen(), tuple(reports), lines.items())
    finally:
        backend.stop()
    if coordinator.lost_ranks:  # their tasks would hold the job open until Spark's own timeout: end it now
        raise RuntimeError(f"spark_dist: ranks {[r.rank for r in coordinator.lost_ranks]} went silent; "
                           f"{verdict(watched, spec.secret)}")
    return records + [watched]
