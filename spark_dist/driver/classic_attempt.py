"""One attempt from a classic session, or in local mode: the driver hosts the run's store and runs the
:class:`~spark_dist.driver.coordinator.Coordinator`, while a barrier job (``mapPartitions`` under a job group) or
local processes serve the ranks. Its sibling under Spark Connect is
:class:`~spark_dist.driver.connect_attempt.ConnectAttempt`; :class:`~spark_dist.driver.distributor.Distributor` runs either.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from typing import Any, List, Optional

from ..task import checkpoint_dirs, output
from ..spark import session
from ..config import CONF_STORE_PORT, RunConfig
from .coordinator import Coordinator
from .outcome import Outcome, outcome_of
from ..wire.protocol import ABORT, Abort, LaunchSpec
from ..wire.ranks import TaskInfo
from ..wire.signed_store import SignedStore, bind_in_range, host_store
from ..task.barrier_task import run_barrier_partition, serve_rank, spawn_child


class ClassicAttempt:
    """One attempt: its own store, secret, ports and job group, so nothing of an earlier attempt can join."""

    def __init__(self, owner, config: RunConfig, backend, job_bytes: bytes, attempt: int,
                 handles, checkpoint_dir: str, spark, time_left: Optional[float]):
        self.owner, self.config, self.backend, self.attempt = owner, config, backend, attempt
        self.spark = spark
        self.deadline = None if time_left is None else time.monotonic() + max(time_left, 0.0)
        self.group = f"spark_dist-{config.run_id}-{attempt}"
        # Only the port now: the store itself starts once the job is submitted, so the driver's first
        # `import torch` overlaps the tasks' launch instead of delaying it.
        # On spark.dist.storePort's first free port when set (a firewall opens only those), else any free one.
        self._listener = bind_in_range(config.bind_address, config.store_ports, CONF_STORE_PORT)
        port = self._listener.getsockname()[1]
        self.spec = LaunchSpec(
            run_id=config.run_id, attempt=attempt,
            store_host=config.driver_host, store_port=port, job_bytes=job_bytes, secret=os.urandom(32),
            use_gpu=config.use_gpu, rendezvous_timeout=config.rendezvous_timeout,
            checkpoint_dir=checkpoint_dir, datasets=handles, collective_timeout=config.collective_timeout,
            backend=config.backend, max_result_bytes=config.max_result_bytes,
            processes_per_task=config.processes_per_task, relay_output=owner.log_ranks,
            remove_checkpoint_dir=checkpoint_dirs.removed_after_success(config),
        )
        self._store_server = None
        self.records: List[Any] = []
        self.job_error: List[BaseException] = []
        self.done = threading.Event()

    def run(self) -> Outcome:
        thread = threading.Thread(target=self._job, name=self.group, daemon=True)
        thread.start()
        try:
            self._store_server, _ = host_store(self.config.bind_address, self.config.rendezvous_timeout,
                                               self._listener)
        except BaseException:
            self._listener.close()
            self._cancel()
            thread.join()
            raise
        store = SignedStore(self._store_server, self.spec.secret, self.spec.prefix)
        coordinator = Coordinator(store, self.config, self.spec, self.backend, job_ended=self.done.is_set,
                                  cancel=self._cancel, on_report=self.owner._on_report, deadline=self.deadline,
                                  host=self.config.driver_host, bind_address=self.config.bind_address,
                                  on_output=output.printer(self.owner.log_ranks),
                                  on_progress=self.owner._on_progress)
        try:
            coordinator.watch(self.done.wait)
            thread.join()
            if self.job_error and not store.has(ABORT):
                store.put(ABORT, Abort.JOB_FAILED)  # supervisors still running stop their ranks
            coordinator.drain_reports(final=True)
            coordinator.drain_output(final=True)
            coordinator.drain_progress(time.monotonic(), final=True)
            seen = coordinator.seen(self.records, self.job_error[0] if self.job_error else None)
        except BaseException:  # the caller gave up (Ctrl-C in a notebook): stop the ranks and the job
            store.put(ABORT, Abort.CANCELLED)
            self._cancel()
            thread.join(self.config.abort_grace_period + 5)
            raise
        finally:
            self.backend.stop()
            # Dropping the last reference stops the store's server and closes its port.
            del store, coordinator
            self._store_server = None
        return outcome_of(dataclasses.replace(seen, store_port=self.spec.store_port))

    def _cancel(self) -> None:
        if not self.config.local_mode:
            session.cancel(self.spark, self.group)

    def _job(self) -> None:
        try:
            if self.config.local_mode:
                self._run_local()
            else:
                sc = self.spark.sparkContext
                sc.setJobGroup(self.group, self.config.job_description(self.attempt), True)
                n = self.config.num_tasks
                rdd = sc.parallelize(range(n), n).barrier().mapPartitions(
                    functools.partial(run_barrier_partition, self.spec))
                # The UDFs' workers: the model's pandas_udf after a fit finds this run's (torch imported).
                self.records.extend(session.collect_in_udf_workers(self.spark, rdd))
        except BaseException as exc:  # a lost executor, a cancelled job: reported as the run's failure
            self.job_error.append(exc)
        finally:
            self.done.set()

    def _run_local(self) -> None:
        from ..spark.resources import local_gpu_addresses

        n = self.config.num_processes
        gpus = local_gpu_addresses(n, self.spark) if self.config.use_gpu else [None] * n
        errors: List[BaseException] = []

        def serve(i):
            try:
                # The driver is one node whatever the layout (PySpark runs torchrun --nnodes=1 there).
                task = TaskInfo(i, self.config.driver_host, (gpus[i],) if gpus[i] is not None else (), "", 0)
                self.records.extend(serve_rank(self.spec, task, spawn_child))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
