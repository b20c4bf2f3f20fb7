"""The driver side of a run: :class:`Distributor`.

One ``run()``: validate (before any job) -> materialise datasets -> per attempt: host the run's store, start
one barrier task per rank (or local processes), assign ranks as tasks report in, relay reports, watch for
the first failure or the timeout -> rank 0's result, or :class:`TrainingFailedError`, or a retry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from . import checkpoint_dirs, output, python_daemon, session, tracking
from .backends import get_backend
from .config import CONF_RETRY_SLOT_WAIT, CONF_STORE_PORT, RunConfig
from .pickling import by_value
from .context import LOG_KEY, REPORT_KEYS
from .errors import ConfigError, RankFailure, RunTimeoutError, TrainingFailedError, root_cause
from .rendezvous import SignedStore, TaskInfo, bind_in_range, host_store
from .connect_launch import ConnectAttempt
from .coordinator import Coordinator
from .outcome import Outcome, outcome_of, worth_retrying
from .protocol import ABORT, Abort, Job, LaunchSpec
from .worker import run_barrier_partition, serve_rank, spawn_child

log = logging.getLogger("spark_dist")


class Distributor:
    """Runs a training function or script on ``num_processes`` ranks of a Spark cluster.

    Args:
        num_processes: ranks to run; with ``use_gpu`` one per GPU: a task of k GPUs
            (``spark.task.resource.gpu.amount`` = k) runs k ranks, so ``num_processes`` must be a multiple of k.
        backend: ``"ddp"`` (PyTorch DDP; call ``init_process_group()`` in your function) or ``"horovod"``.
        local_mode: run the ranks as processes on the driver instead of Spark tasks.
        use_gpu: one GPU per rank (``spark.task.resource.gpu.amount`` per task); NCCL is then the backend
            to pass to ``init_process_group``.
        max_retries: resubmit a failed run this many times; the function resumes from its last checkpoint.
        timeout: seconds the whole run may take (all attempts, counted once the datasets are written: a
            first write of a large DataFrame is Spark's work, not training); ``None`` for no limit.
        checkpoint_dir: where ``ctx.save_checkpoint`` writes (conf ``spark.dist.checkpointDir``); it must be
            visible to every executor. Default: a per-run directory in the driver's temp dir.
        run_id: name of the run; give the id of an earlier run to resume from its checkpoints.
        verbose: print reports and the final summary on the driver.
        log_ranks: which ranks' printed lines (stdout, stderr, ``logging``) appear on the driver's
            ``sys.stdout`` / ``sys.stderr``, each prefixed ``[rank N] ``: ``"all"``, ``"rank0"`` or ``"none"``
            (default: ``"all"`` when ``verbose``, else ``"none"``). They stay in the executor logs as well.
        layout: what a node is for the torchrun variables (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
            ``GROUP_RANK``/``NODE_RANK``, ``CUDA_VISIBLE_DEVICES``): ``"host"`` (the default) numbers the ranks
            of a machine 0, 1, ... as torchrun on that machine would; ``"task"`` makes each Spark task a node,
            as PySpark's TorchDistributor does (``LOCAL_RANK`` 0 for one-GPU tasks), which recipes written for
            it expect (Lightning's ``Trainer(devices=1, num_nodes=num_processes)``). Either way
            ``cuda:LOCAL_RANK`` is the rank's own GPU, and with ``use_gpu=False`` the ranks see no GPU
            (``CUDA_VISIBLE_DEVICES=""``).

    Raises:
        ConfigError: a bad argument (raised here or by ``run`` before any Spark job), naming it.
    """

    def __init__(self, num_processes: int = 1, backend: str = "ddp", local_mode: bool = False,
                 use_gpu: bool = False, max_retries: int = 0, timeout: Optional[float] = None, *,
                 checkpoint_dir: Optional[str] = None, run_id: Optional[str] = None, verbose: bool = True,
                 log_ranks: Optional[str] = None, layout: str = "host", spark=None):
        self._args = dict(num_processes=num_processes, backend=backend, local_mode=local_mode, use_gpu=use_gpu,
                          max_retries=max_retries, timeout=timeout, run_id=run_id, checkpoint_dir=checkpoint_dir,
                          layout=layout)
        RunConfig.build(arguments_only=True, **self._args)  # fail fast; run() checks the conf too
        self.verbose = verbose
        self._bar = output.ProgressBar()
        self._tracker = tracking.Tracker.inactive()
        if log_ranks is not None and log_ranks not in output.LOG_RANKS:
            raise ConfigError(f"log_ranks must be one of {', '.join(map(repr, output.LOG_RANKS))}, got {log_ranks!r}")
        self.log_ranks = log_ranks or ("all" if verbose else "none")
        self._spark = spark
        self.history: List[Dict[str, Any]] = []
        self.input_stats: List[Dict[str, Any]] = []  # per rank: input_wait_seconds, train_seconds, batches
        self.last_run_id: Optional[str] = None

    # ----------------------------------------------------------------------------------------------------
    def run(self, train_object, *args, datasets: Optional[Dict[str, Any]] = None, **kwargs):
        """Run ``train_object`` (a function, or the path of a ``.py`` script and its arguments) on every rank.

        Returns:
            What rank 0's function returned (``None`` for a script).

        Raises:
            ConfigError: bad settings or input, before any Spark job.
            TrainingFailedError: a rank failed (after ``max_retries`` retries); it names the first failed
                rank and host and carries that rank's exception type, message and traceback.
            RunTimeoutError: the run took longer than ``timeout``.
        """
        return self._run(train_object, args, kwargs, datasets)

    def _run(self, train_object, args, kwargs, datasets: Optional[Dict[str, Any]]):
        spark = self._session()
        conf = _spark_conf(spark)
        remote = session.is_connect(spark)
        if remote:  # the server's driver addresses are not this client's: local mode binds here
            conf = {k: v for k, v in conf.items() if k not in ("spark.driver.host", "spark.driver.bindAddress")}
        config = RunConfig.build(spark_conf=conf, **self._args)
        backend = get_backend(config.backend, config)
        backend.check_available()
        job_bytes = _pickle_job(train_object, args, kwargs)
        if config.local_mode and config.use_gpu:
            from .resources import local_gpu_addresses

            local_gpu_addresses(config.num_processes, spark)
        if not config.local_mode and spark is None:
            raise ConfigError("local_mode=False needs an active SparkSession (or pass local_mode=True)")
        self._wait_for_slots(config, spark)
        if not config.local_mode:  # before the run's first Python task starts the session's daemon
            python_daemon.use_in_session(spark)
        handles = {}
        if datasets:
            handles = _prepared(spark, datasets, config.num_processes)
        checkpoint_dir = _run_checkpoint_dir(config)
        if not config.local_mode and config.checkpoint_dir is None and (config.max_retries or config.resume):
            from .data.cache import remote_hosts

            hosts = session.executor_hosts(spark)
            if hosts is None:  # Spark Connect: the executors' hosts are unknown, so they may be elsewhere
                unshared = [] if session.is_local_master(spark) else ["hosts a Spark Connect client cannot see"]
            else:
                unshared = remote_hosts(config.driver_host, hosts)
            if unshared:
                log.warning("spark_dist: run %s may resume from checkpoints, but the default checkpoint dir is "
                            "on each machine's own disk and executors run on other hosts (%s): a retried rank 0 "
                            "on another host would not find them. Set spark.dist.checkpointDir (or "
                            "checkpoint_dir=) to a filesystem every executor sees.", config.run_id,
                            ", ".join(unshared))
        self.history, self.input_stats = [], []
        self.last_run_id = config.run_id
        self._bar = output.ProgressBar()
        self._tracker = tracking.Tracker(config.run_id, tracking.run_params({**self._args, "run_id": config.run_id}))
        try:
            result = self._attempts(config, spark, remote, backend, job_bytes, handles, checkpoint_dir)
        except BaseException:
            self._tracker.end(failed=True)
            raise
        self._tracker.input_stats(self.input_stats)
        self._tracker.end()
        return result

    def _attempts(self, config: RunConfig, spark, remote: bool, backend, job_bytes: bytes, handles,
                  checkpoint_dir: str):
        """Attempt after attempt until one succeeds, or the failures are not worth another."""
        started = time.monotonic()
        failures_seen: List[RankFailure] = []
        for attempt in range(config.max_retries + 1):
            if attempt:  # a lost executor may still be coming back
                self._wait_to_retry(config, spark, failures_seen, attempt, started)
            remaining = None if config.timeout is None else config.timeout - (time.monotonic() - started)
            with _kept(handles):  # no eviction of these caches while the ranks read them
                kind = ConnectAttempt if remote and not config.local_mode else _Attempt
                outcome = kind(self, config, backend, job_bytes, attempt, handles, checkpoint_dir,
                                   spark, remaining).run()
            if outcome.failures is None:
                import cloudpickle

                result = cloudpickle.loads(outcome.result_bytes)
                self._summary(config, attempt, time.monotonic() - started)
                if checkpoint_dirs.removed_after_success(config):  # the driver's own copy (local mode)
                    checkpoint_dirs.remove(checkpoint_dir)
                return result
            previous, failures_seen = failures_seen, outcome.failures
            self._bar.close()
            if outcome.timed_out:
                raise RunTimeoutError(failures_seen, attempt + 1, config.run_id)
            if attempt < config.max_retries and worth_retrying(failures_seen, config.num_processes, previous):
                log.warning("spark_dist: attempt %d of run %s failed (%s); retrying", attempt, config.run_id,
                            root_cause(failures_seen).headline())
                backend = get_backend(config.backend, config)
                continue
            raise TrainingFailedError(failures_seen, attempt + 1, config.run_id)
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _wait_for_slots(config: RunConfig, spark, timeout: Optional[float] = None) -> None:
        if not config.local_mode:
            from .resources import wait_for_slots

            wait_for_slots(spark, config.num_tasks, config.slot_wait_timeout if timeout is None else timeout,
                           config.use_gpu, config.processes_per_task)

    def _wait_to_retry(self, config: RunConfig, spark, failures: List[RankFailure], attempt: int,
                       started: float) -> None:
        """Wait for the slots of the next attempt as long as the cluster manager may need to replace a lost
        executor (a YARN container or Kubernetes pod takes minutes), within ``timeout``.

        Raises:
            ConfigError: the slots did not come back in time, naming the key; its ``__cause__`` is the
                :class:`TrainingFailedError` of the attempt that failed.
        """
        wait = config.retry_slot_wait_timeout
        if config.timeout is not None:
            wait = min(wait, max(config.timeout - (time.monotonic() - started), 0.0))
        try:
            self._wait_for_slots(config, spark, wait)
        except ConfigError as exc:
            raise ConfigError(
                f"run {config.run_id} could not be retried: {exc} after waiting {wait:g}s for the cluster to "
                f"replace lost executors (raise {CONF_RETRY_SLOT_WAIT}, or timeout=); attempt {attempt - 1} had "
                f"failed: {root_cause(failures).headline()}") from TrainingFailedError(failures, attempt, config.run_id)

    def _session(self):
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None or self._args["local_mode"]:
            return active
        return SparkSession.builder.getOrCreate()

    def _on_report(self, record: Dict[str, Any]) -> None:
        if LOG_KEY in record:  # log_to_driver: shown whatever the verbosity, kept nowhere
            print(record[LOG_KEY], flush=True)
            return
        if "input_wait_seconds" in record:  # the rank's input statistics, shown in the summary
            self.input_stats.append(record)
            return
        self.history.append(record)
        self._tracker.report(record)
        if self.verbose:
            metrics = {k: v for k, v in record.items() if k not in REPORT_KEYS}
            if record.get("rank") == 0:
                self._bar.show_metrics(metrics)
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
            print(f"[spark_dist rank {record.get('rank')}] {shown}", flush=True)

    def _on_progress(self, progress) -> None:
        """Where rank 0's loader is (epoch, step, steps, its steps/s): the bar only, not history."""
        if self.verbose:
            self._bar.advance(*progress)

    def history_frame(self):
        """The last run's ``ctx.report`` records as a pandas DataFrame, one row per report in the order they
        arrived: ``rank``, ``attempt``, ``time`` (a timestamp) and one column per metric, ready to plot
        (``d.history_frame().query("rank == 0").plot(x="epoch", y="loss")``)."""
        return history_frame(self.history)

    def _summary(self, config: RunConfig, attempt: int, seconds: float) -> None:
        self._bar.close()
        if not self.verbose:
            return
        last = next((r for r in reversed(self.history) if r.get("rank") == 0), None)
        tail = "" if last is None else "; last report: " + " ".join(
            f"{k}={_fmt(v)}" for k, v in last.items() if k not in REPORT_KEYS)
        where = "local processes" if config.local_mode else "Spark barrier tasks"
        retried = f" after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else ""
        print(f"[spark_dist] run {config.run_id}: {config.num_processes} ranks ({config.backend}, {where}) "
              f"finished in {seconds:.2f}s{retried}{tail}", flush=True)
        for stats in sorted(self.input_stats, key=lambda r: r["rank"]):
            share = stats["input_wait_seconds"] / max(stats["train_seconds"], 1e-9)
            hint = "  <- input-bound: raise batch_size or give the loader more cores" if share > 0.3 else ""
            print(f"[spark_dist]   rank {stats['rank']}: waited {stats['input_wait_seconds']:.2f}s for data in "
                  f"{stats['train_seconds']:.2f}s of training ({share:.0%}), {stats['batches']} batches{hint}",
                  flush=True)


def _spark_conf(spark) -> Dict[str, str]:
    """The session's conf, with spark_dist's keys as set at run time (see :func:`session.conf_snapshot`)."""
    from . import config as keys

    return session.conf_snapshot(spark, keys.RUNTIME_KEYS)


def _prepared(spark, datasets: Dict[str, Any], num_ranks: int) -> Dict[str, Any]:
    """Dataset handles for the ranks: DataFrames are materialised (which needs Spark); handles that
    ``prepare_datasets`` returned before pass through, so a local-mode run needs no SparkSession for them."""
    from .data import DatasetHandle

    if spark is None:
        if not isinstance(datasets, dict) or not all(isinstance(d, DatasetHandle) for d in datasets.values()):
            raise ConfigError("datasets= holding DataFrames needs an active SparkSession")
        from .data.cache import pass_through

        return {name: pass_through(name, handle, num_ranks) for name, handle in datasets.items()}
    from .data import prepare_datasets

    return prepare_datasets(spark, datasets, num_ranks)


def _kept(handles: Dict[str, Any]):
    if not handles:
        return contextlib.nullcontext()
    from .data.cache import in_use

    return in_use(handles.values())


def history_frame(records: List[Dict[str, Any]]):
    """``records`` (reports or per-epoch history) as a pandas DataFrame; ``time`` as timestamps."""
    import pandas as pd

    frame = pd.DataFrame.from_records(list(records))
    if "time" in frame.columns:
        frame["time"] = pd.to_datetime(frame["time"], unit="s")
    return frame


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _run_checkpoint_dir(config: RunConfig) -> str:
    """The run's checkpoint directory as its ranks get it, drawn once per run (its retries resume from it):
    ``<root>/<run_id>`` under a given root, each run its own, so a new run never resumes another's and
    naming an earlier ``run_id`` resumes it; else the default's name, which each rank places in its own
    host's private temp dir (:mod:`~spark_dist.checkpoint_dirs`, which also checks it there each time).

    Raises:
        ConfigError: the given root is visible here and the run's directory in it is someone else's or
            writable by others (checkpoints are unpickled), naming the key to change.
    """
    if config.checkpoint_dir is None:
        return checkpoint_dirs.default_name(config.run_id, named=config.resume)
    path = os.path.join(config.checkpoint_dir, config.run_id)
    try:
        checkpoint_dirs.check_dir(path)
    except checkpoint_dirs.CheckpointDirError as exc:
        raise ConfigError(f"{exc} (or use another run_id)") from None
    except OSError:  # the driver may not mount the executors' shared filesystem: the ranks make and check it
        pass
    return path


def _pickle_job(train_object, args, kwargs) -> bytes:
    """Pickle the function (or read the script) on the driver, so errors show here, before any job.

    Raises:
        ConfigError: ``train_object`` is neither callable nor an existing ``.py`` file.
    """
    import cloudpickle

    if isinstance(train_object, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(train_object))
        if not os.path.isfile(path):
            raise ConfigError(f"train_object {train_object!r} is not a file (pass a function or a .py path)")
        if kwargs:
            raise ConfigError("keyword arguments cannot be passed to a script: pass them as '--name=value' args")
        with open(path, "rb") as f:
            source = f.read()
        job = Job(script_path=path, script_source=source, script_args=tuple(str(a) for a in args))
        return cloudpickle.dumps(job)
    if not callable(train_object):
        raise ConfigError(f"train_object must be a function or a path to a .py file, got {type(train_object).__name__}")
    with by_value([train_object]):
        try:
            return cloudpickle.dumps(Job(fn=train_object, args=tuple(args), kwargs=dict(kwargs)))
        except Exception as exc:
            raise ConfigError(f"the training function or its arguments cannot be pickled: {exc}") from exc


class _Attempt:
    """One attempt: its own store, secret, ports and job group, so nothing of an earlier attempt can join."""

    def __init__(self, owner: Distributor, config: RunConfig, backend, job_bytes: bytes, attempt: int,
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
        from .resources import local_gpu_addresses

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
