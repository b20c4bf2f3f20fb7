"""One attempt of a run: its own store, secret, ports and job tag, so nothing of an earlier attempt can join.

Every attempt on a Spark session launches the same way: one barrier stage,
``spark.range(0, n, 1, n).mapInArrow(run_partition, RECORDS_SCHEMA, barrier=True)``
(:func:`~spark_dist.task.partition.run_partition`), whose tasks are the Python workers of the session's SQL UDFs.
What varies is where the ranks and the run's store are:

- **classic session**: the driver hosts the store and runs the :class:`~spark_dist.driver.coordinator.Coordinator`
  while the job runs under a job group (which the Spark UI's kill link and ``sc.cancelJobGroup`` also reach).
- **Spark Connect**: the executors may not reach the client, so the first task hosts the store and the
  coordinator (:mod:`spark_dist.driver.first_task`); the job runs under a job tag. A store port taken there
  relaunches the attempt on another; what the coordinator saw comes back with the records, or inside the error
  with which the first task failed the stage when ranks went silent.
- **local mode**: the ranks are processes on the driver (no Spark job), and the driver hosts the store.

:class:`~spark_dist.driver.distributor.Distributor` runs one :class:`Attempt` per try.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
import threading
import time
from typing import Any, List, NamedTuple, Optional

from ..config import CONF_HOST_LOST_TIMEOUT, CONF_STORE_PORT, RunConfig
from ..spark import session
from ..task import checkpoint_dirs, output
from ..task.barrier_task import serve_rank
from ..task.child_process import spawn_child
from ..task.partition import run_partition
from ..wire import abort_watch
from ..wire.protocol import ABORT, Abort, LaunchSpec
from ..wire.ranks import TaskInfo
from ..wire.sealed_store import SealedStore, bind_in_range, host_store
from . import elastic, first_task
from .coordinator import Coordinator
from .outcome import AttemptEvidence, JobError, Outcome, outcome_of

# How long the client waits for the job after the first task's own timeout (and the abort grace) under Connect,
# and for the job's end once it cancelled it: the stage's end travels back through the server.
_CONNECT_MARGIN_S = 30.0
_CANCEL_WAIT_S = 60.0
# How long a run the caller gave up on may take to end by itself after the abort before its job is cancelled: the
# supervisors see the abort within 50 ms (their watches are woken by the store) and kill their ranks at once.
_STOP_WAIT_S = 3.0

# How long the driver waits for Spark to mark a silent executor removed before the next attempt is placed.
_REPLACE_MARK_S = 2.0

log = logging.getLogger("spark_dist")


class Sizes(NamedTuple):
    """An attempt's place in its run's sizes: ``initial`` (``num_processes``) and ``previous`` (the last
    attempt's ranks; 0 for the first)."""

    initial: int = 0
    previous: int = 0


def launch_spec(config: RunConfig, attempt: int, job_bytes: bytes, handles, checkpoint_dir: str,
                relay_output: str, store_host: str = "", store_port: int = 0, sizes: Sizes = Sizes(),
                secret: Optional[bytes] = None, executor_log: bool = True, every_result: bool = False
                ) -> LaunchSpec:
    """What every task of the attempt gets; a fresh secret (``secret``: the one a lane derives for it), so
    nothing of an earlier attempt can join. ``store_host``/``store_port``: where the driver hosts the store
    (empty under Connect: the first task's). ``executor_log``: whether executors have logs of their own;
    ``every_result``: every rank's return comes back, not rank 0's alone."""
    return LaunchSpec(
        run_id=config.run_id, attempt=attempt, store_host=store_host, store_port=store_port, job_bytes=job_bytes,
        secret=secret or os.urandom(32), use_gpu=config.use_gpu, rendezvous_timeout=config.rendezvous_timeout,
        checkpoint_dir=checkpoint_dir, datasets=handles, collective_timeout=config.collective_timeout,
        backend=config.backend, max_result_bytes=config.max_result_bytes,
        processes_per_task=config.processes_per_task, relay_output=relay_output, executor_log=executor_log,
        every_result=every_result,
        remove_checkpoint_dir=checkpoint_dirs.removed_after_success(config),
        initial_world_size=sizes.initial or config.num_processes, previous_world_size=sizes.previous,
        host_lost_timeout=0.0 if config.local_mode else config.host_lost_timeout,
        # Rank 0 stops at a checkpoint when the driver asks (a preemption, a grow): never in local mode.
        watch_resize=not config.local_mode)


class Attempt:
    """One attempt (see the module docstring); ``run()`` returns its :class:`~spark_dist.driver.outcome.Outcome`.

    Args:
        owner: the Distributor (``log_ranks``, ``_on_report``, ``_on_progress``).
        time_left: seconds the run may still take (``None``: no limit).
        sizes: the run's sizes (elastic runs); ``config.num_processes`` is this attempt's.
    """

    def __init__(self, owner, config: RunConfig, backend, job_bytes: bytes, attempt: int, handles,
                 checkpoint_dir: str, spark, time_left: Optional[float], sizes: Sizes = Sizes()):
        self.owner, self.config, self.backend, self.attempt, self.spark = owner, config, backend, attempt, spark
        self.time_left = time_left
        self.deadline = None if time_left is None else time.monotonic() + max(time_left, 0.0)
        self.tag = config.job_tag(attempt)
        self.store_in_task = not config.local_mode and session.is_connect(spark)
        # A tuning study's trial runs on its lane (a barrier job serving run after run), not a job of its own.
        self.lane = None if self.store_in_task or config.local_mode else getattr(owner, "_lane", None)
        self._listener = None
        self.submitted_at: Optional[float] = None  # time.time() when the job (or local ranks) started
        self.seen: Optional[AttemptEvidence] = None  # what the attempt saw, once it ended
        host, port = "", 0
        if not self.store_in_task:
            # Only the port now: the store itself starts once the job is submitted, so the driver's first
            # `import torch` overlaps the tasks' launch. On spark.dist.storePort's first free port when set
            # (a firewall opens only those), else any free one.
            self._listener = bind_in_range(config.bind_address, config.store_ports, CONF_STORE_PORT)
            host, port = config.driver_host, self._listener.getsockname()[1]
        secret = None if self.lane is None else self.lane.run_secret(config.run_id, attempt)
        # On a classic local master the executor's streams are this console (under Connect, the server's).
        executor_log = config.local_mode or self.store_in_task or not session.is_local_master(spark)
        self.spec = launch_spec(config, attempt, job_bytes, handles, checkpoint_dir, owner.log_ranks, host, port,
                                sizes, secret, executor_log, getattr(owner, "_every_result", False))
        # What the driver watches for: a decommissioned executor under a rank, the missing ranks' slots.
        self.resize_check = elastic.watch(config, spark, sizes.initial or config.num_processes)

    def run(self) -> Outcome:
        """The attempt's outcome; a failure of the ranks or of the job is in it, not raised.

        Raises:
            ConfigError: under Connect, naming ``spark.dist.storePort``: every port drawn from it was taken.
            KeyboardInterrupt: the caller gave up (Ctrl-C): the job and its ranks were stopped first.
        """
        return self._run_store_in_task() if self.store_in_task else self._run_store_here()

    # -- the job ---------------------------------------------------------------------------------------------
    def _collect(self, spec: LaunchSpec, host_store) -> List[Any]:
        """Run the barrier stage under the attempt's tag and description (or serve the attempt on its lane);
        every task's records."""
        if self.lane is not None:
            return self.lane.collect(spec)
        n = self.config.num_tasks
        task = functools.partial(run_partition, spec, host_store)
        frame = session.task_stage(self.spark, n, task, barrier=True)
        with session.job_scope(self.spark, self.tag, self.config.job_description(spec.attempt)):
            return session.collect_records(frame)

    def _cancel(self) -> None:
        if self.lane is not None:
            self.lane.cancel()
        elif not self.config.local_mode:
            session.cancel(self.spark, self.tag)

    def _start(self, target) -> tuple:
        """Run ``target(records)`` (which adds the tasks' records to the list) in a thread:
        ``(thread, done, records, errors)``; a lost executor, a cancelled job, an interrupt end up in
        ``errors``, reported as the attempt's failure."""
        done, records, errors = threading.Event(), [], []
        self.submitted_at = time.time()

        def job():
            try:
                target(records)
            except BaseException as exc:  # noqa: BLE001 -- the attempt's outcome says it
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=job, name=self.tag, daemon=True)
        thread.start()
        return thread, done, records, errors

    # -- the store here: a classic session, or local mode ----------------------------------------------------
    def _run_store_here(self) -> Outcome:
        if self.config.local_mode:
            thread, done, records, errors = self._start(self._run_local)
        else:
            thread, done, records, errors = self._start(lambda into: into.extend(self._collect(self.spec, None)))
        try:
            server, _ = host_store(self.config.bind_address, self.config.rendezvous_timeout, self._listener)
        except BaseException:
            self._listener.close()
            self._cancel()
            thread.join()
            raise
        store = SealedStore(server, self.spec.secret, self.spec.prefix)
        coordinator = Coordinator(store, self.config, self.spec, self.backend, job_ended=done.is_set,
                                  cancel=self._cancel, on_report=self.owner._on_report, deadline=self.deadline,
                                  host=self.config.driver_host, bind_address=self.config.bind_address,
                                  on_output=output.printer(self.owner.log_ranks),
                                  on_progress=self.owner._on_progress, resize_check=self.resize_check,
                                  on_poll=self.owner._on_poll,
                                  on_stall=lambda diagnosis: self.owner._on_stall(diagnosis, self.attempt))
        try:
            coordinator.watch(done.wait)
            self._replace_lost_executors(coordinator)
            thread.join()
            if errors and not store.has(ABORT):
                store.put(ABORT, Abort.JOB_FAILED)  # supervisors still running stop their ranks
            coordinator.drain_reports(final=True)
            coordinator.drain_output(final=True)
            coordinator.drain_progress(time.monotonic(), final=True)
            seen = coordinator.seen(records, errors[0] if errors else None)
        except BaseException:  # the caller gave up (Ctrl-C in a notebook, a pruned trial): stop the ranks
            store.put(ABORT, Abort.CANCELLED)
            # The supervisors kill their ranks on the abort and the tasks return: the job ends by itself, and
            # the executors keep their Python workers warm for the next run (a cancelled task's worker is
            # killed). Cancelled only when a task does not return in time (a silent host's).
            if not done.wait(_STOP_WAIT_S):
                self._cancel()
            thread.join(self.config.abort_grace_period + 5)
            raise
        finally:
            self.backend.stop()
            abort_watch.release(store)  # the supervisors' watches still waiting end before their connections do
            # Dropping the last reference stops the store's server and closes its port.
            del store, coordinator, server
        self.seen = dataclasses.replace(seen, store_port=self.spec.store_port)
        return outcome_of(self.seen)

    def _replace_lost_executors(self, coordinator: Coordinator) -> None:
        """The ranks whose supervisors went silent: Spark replaces their executors now (classic sessions), not at its
        own executor timeout; until then it would place the next attempt's tasks on an executor's free slots
        there too, tasks that never start. Only those executors: another on the same host still answering keeps
        its tasks and cached blocks. Spark marks an executor it removes at once, then waits for the cluster
        manager's answer (up to spark.rpc.askTimeout where it cannot be reached): the driver waits for the mark,
        not the answer. Not with ``spark.dist.replaceLostExecutors=false``: the retry may then be placed there
        until Spark's own timeout."""
        if not coordinator.silent_ranks or self.config.local_mode or not self.config.replace_lost_executors:
            return
        silent = set(coordinator.silent_ranks)
        tasks = [t for t, r in zip(coordinator.tasks, coordinator.ranks) if r.rank in silent]
        if not tasks:
            return
        run_id, hosts = self.config.run_id, ", ".join(sorted({r.host for r in coordinator.lost_ranks}))

        def replace():
            replaced = session.replace_lost_executors(self.spark, tasks[0].stage, {t.partition for t in tasks})
            if replaced:
                log.warning("spark_dist: run %s: asked Spark to replace executor%s %s on %s, silent for %gs (%s)",
                            run_id, "s" * (len(replaced) > 1), ", ".join(replaced), hosts,
                            self.config.host_lost_timeout, CONF_HOST_LOST_TIMEOUT)

        asking = threading.Thread(target=replace, name=f"{self.tag}-replace", daemon=True)
        asking.start()
        asking.join(_REPLACE_MARK_S)

    def _run_local(self, records: List[Any]) -> None:
        """The ranks as processes on the driver, one serving thread each; their records into ``records``."""
        from ..spark.resources import local_gpu_addresses

        n = self.config.num_processes
        gpus = local_gpu_addresses(n, self.spark) if self.config.use_gpu else [None] * n
        errors: List[BaseException] = []

        def serve(i):
            try:
                # The driver is one node whatever the layout (PySpark runs torchrun --nnodes=1 there).
                task = TaskInfo(i, self.config.driver_host, (gpus[i],) if gpus[i] is not None else (), "", 0)
                records.extend(serve_rank(self.spec, task, spawn_child))
            except BaseException as exc:  # noqa: BLE001 -- re-raised below, as the job's failure
                errors.append(exc)

        threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    # -- the store in the first task: Spark Connect ----------------------------------------------------------
    def _run_store_in_task(self) -> Outcome:
        started = time.monotonic()
        tried = first_task.ports_to_try(self.config.store_ports, random.SystemRandom())
        for port in tried:
            spec = dataclasses.replace(self.spec, store_port=port)
            time_left = None if self.time_left is None else self.time_left - (time.monotonic() - started)
            records, error, timed_out = self._job_in_task(spec, time_left)
            if error is None or first_task.PORT_TAKEN not in str(error):
                break
        else:
            if self.config.store_ports is not None:
                raise first_task.configured_ports_taken(self.config.store_ports, tried, str(error))
        return self._outcome_from_task(records, error, timed_out, port)

    def _job_in_task(self, spec: LaunchSpec, time_left: Optional[float]):
        # The tasks need the run's settings, not the session's whole conf (which may hold credentials).
        config = dataclasses.replace(self.config, spark_conf={})
        hosting = functools.partial(first_task.host_and_watch, config, time_left)
        thread, done, records, errors = self._start(lambda into: into.extend(self._collect(spec, hosting)))
        # The first task enforces the timeout itself (and dumps the ranks' stacks); the client interrupts
        # only if the job outlives it by the abort grace and a margin for the stage's end.
        limit = None if time_left is None else max(time_left, 0.0) + self.config.abort_grace_period \
            + _CONNECT_MARGIN_S
        timed_out = False
        try:
            if not done.wait(limit):
                timed_out = True
                self._cancel()
                done.wait(_CANCEL_WAIT_S)
        except BaseException:  # Ctrl-C on the client: the job goes, and its tasks with their ranks
            self._cancel()
            thread.join(_CANCEL_WAIT_S)
            raise
        return list(records), (errors[0] if errors else None), timed_out

    def _outcome_from_task(self, records, error: Optional[BaseException], timed_out: bool,
                           store_port: int) -> Outcome:
        """The outcome from what the first task saw: its :class:`~spark_dist.driver.first_task.FirstTaskReport` record,
        or the verdict in the error with which it failed the stage; its reports and output shown here."""
        from_first_task = next((r for r in records if isinstance(r, first_task.FirstTaskReport)), None)
        if from_first_task is None and error is not None:
            from_first_task = first_task.verdict_in(str(error), self.spec.secret)
            error = None if from_first_task is not None else error
        if from_first_task is None:
            seen = AttemptEvidence(driver_host=self.config.driver_host,
                                   rendezvous_timeout=self.config.rendezvous_timeout,
                                   host_lost_timeout=self.config.host_lost_timeout, timeout=self.config.timeout,
                                   now=time.time(), timed_out=timed_out)
        else:
            seen = from_first_task.seen
            for report in from_first_task.reports:
                self.owner._on_report(report)
            show = output.printer(self.owner.log_ranks)
            for line in from_first_task.output if show is not None else ():
                show(*line)
        job_error = None if error is None else JobError(type(error).__name__, str(error))
        self.seen = dataclasses.replace(
            seen, records=tuple(r for r in records if not isinstance(r, first_task.FirstTaskReport)),
            job_error=job_error, store_port=store_port, store_in_task=True)
        return outcome_of(self.seen)
