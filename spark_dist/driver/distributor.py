"""The driver side of a run: :class:`Distributor`.

One ``run()``: validate (before any job) -> materialise datasets -> per attempt: host the run's store, start
one barrier task per rank (or local processes), assign ranks as tasks report in, relay reports, watch for
the first failure or the timeout -> rank 0's result, or :class:`TrainingFailedError`, or a retry.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Dict, List, Optional

from ..data import prepare
from ..host import open_files
from ..task import checkpoint_dirs, output
from ..spark import session, worker_python
from . import elastic, goodput, slots, tracking
from ..backends import get_backend
from ..config import CONF_RETRY_SLOT_WAIT, RunConfig
from ..errors import ConfigError, RankFailure, RunStalledError, RunTimeoutError, TrainingFailedError, root_cause
from .attempt import Attempt, Sizes
from .run_view import RunView, times_of
from .outcome import worth_retrying
from .job_bytes import pickle_job

log = logging.getLogger("spark_dist")
_GROW_SETTLE_S = 30.0


class Distributor(RunView):
    """Runs a training function or script on ``num_processes`` ranks of a Spark cluster.

    Args:
        num_processes: ranks to run; with ``use_gpu`` one per GPU: a task of k GPUs
            (``spark.task.resource.gpu.amount`` = k) runs k ranks, so ``num_processes`` must be a multiple of k.
        backend: ``"ddp"`` (PyTorch DDP; call ``init_process_group()`` in your function) or ``"horovod"``.
        local_mode: run the ranks as processes on the driver instead of Spark tasks.
        use_gpu: one GPU per rank (``spark.task.resource.gpu.amount`` per task); NCCL is then the backend
            to pass to ``init_process_group``.
        max_retries: resubmit a failed run this many times; the function resumes from its last checkpoint.
        min_processes: make the run elastic (conf ``spark.dist.minProcesses``; default ``num_processes``, a
            fixed size): an attempt may run on fewer ranks, down to this many, when the cluster has lost
            executors (a retry starts on the slots left instead of waiting for replacements) or has fewer
            than ``num_processes`` slots at the start; it grows back to ``num_processes`` at the next
            ``ctx.save_checkpoint`` once their slots are free again. The ranks see ``ctx.world_size``,
            ``ctx.initial_world_size`` and ``ctx.resized``; loaders deal the rest of an epoch out to the new
            ranks. See docs/elastic.md.
        timeout: seconds the whole run may take (all attempts, counted once the datasets are written: a
            first write of a large DataFrame is Spark's work, not training; nor is the time an attempt waits
            for slots that other runs of this process hold, see :mod:`spark_dist.driver.slots`); ``None``
            for no limit.
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
                 log_ranks: Optional[str] = None, layout: str = "host", min_processes: Optional[int] = None,
                 spark=None):
        self._args = dict(num_processes=num_processes, backend=backend, local_mode=local_mode, use_gpu=use_gpu,
                          max_retries=max_retries, timeout=timeout, run_id=run_id, checkpoint_dir=checkpoint_dir,
                          layout=layout, min_processes=min_processes)
        RunConfig.build(arguments_only=True, **self._args)  # fail fast; run() checks the conf too
        self.verbose = verbose
        self._bar = output.ProgressBar()
        self._tracker = tracking.Tracker.inactive()
        if log_ranks is not None and log_ranks not in output.LOG_RANKS:
            raise ConfigError(f"log_ranks must be one of {', '.join(map(repr, output.LOG_RANKS))}, got {log_ranks!r}")
        self.log_ranks = log_ranks or ("all" if verbose else "none")
        self._spark = spark
        self.history: List[Dict[str, Any]] = []
        # Per rank: input_wait_seconds, train_seconds, batches (with a loader), and its steps' medians (steps).
        self.input_stats: List[Dict[str, Any]] = []
        self.stalls: List[Any] = []  # the last run's stalls, each a spark_dist.driver.stall.StallDiagnosis
        self.goodput_rows: List[Dict[str, Any]] = []  # the last run's time split, a row per attempt (goodput())
        self._attempt_times: List[goodput.AttemptTimes] = []
        self._run_started = 0.0
        self.last_run_id: Optional[str] = None
        self.checkpoints: List[Dict[str, Any]] = []  # the last run's sharded checkpoints kept, as rank 0 told
        self._checkpoints_kept = True
        self._lane = None  # a tuning trial's LaneHandle (spark_dist.driver.lanes): its attempts run there

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
        self._run_started, self._attempt_times, self.goodput_rows = time.time(), [], []
        spark = self._session()
        conf = _spark_conf(spark)
        remote = session.is_connect(spark)
        if remote:  # the server's driver addresses are not this client's: local mode binds here
            conf = {k: v for k, v in conf.items() if k not in ("spark.driver.host", "spark.driver.bindAddress")}
        config = RunConfig.build(spark_conf=conf, **self._args)
        backend = get_backend(config.backend, config)
        backend.check_available()
        job_bytes = pickle_job(train_object, args, kwargs, **self._job_fields(train_object))
        if config.local_mode and config.use_gpu:
            from ..spark.resources import local_gpu_addresses

            local_gpu_addresses(config.num_processes, spark)
        if not config.local_mode and spark is None:
            raise ConfigError("local_mode=False needs an active SparkSession (or pass local_mode=True)")
        if not config.local_mode:
            worker_python.check(spark, config.spark_conf)
        if not config.local_mode and not remote and (too_few := open_files.shortfall(config.num_processes)):
            raise ConfigError(too_few)  # the store is this process's (under Connect, the first task's)
        first_size = config.num_processes
        if config.elastic and not config.local_mode:
            first_size = elastic.first_size(config, spark, config.slot_wait_timeout)
        else:
            self._wait_for_slots(config, spark)
        handles = {}
        if datasets:
            handles = prepare.prepare_datasets(spark, datasets, config.num_processes)
        checkpoint_dir = checkpoint_dirs.run_dir(config)
        if not config.local_mode and config.checkpoint_dir is None and (config.max_retries or config.resume):
            from ..data.prepare import remote_hosts

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
        self.history, self.input_stats, self.checkpoints, self.stalls = [], [], [], []
        self._checkpoints_kept = not checkpoint_dirs.removed_after_success(config)
        self.last_run_id = config.run_id
        self._bar = output.ProgressBar()
        self._tracker = tracking.Tracker(config.run_id, tracking.run_params({**self._args, "run_id": config.run_id}))
        try:
            result = self._attempts(config, spark, backend, job_bytes, handles, checkpoint_dir, first_size)
        except BaseException:
            self._account(goodput.split(self._run_started, time.time(), self._attempt_times))
            self._tracker.end(failed=True)
            raise
        self._tracker.input_stats(self.input_stats)
        self._tracker.end()
        return result

    def _attempts(self, config: RunConfig, spark, backend, job_bytes: bytes, handles, checkpoint_dir: str,
                  size: int):
        """Attempt after attempt until one succeeds, or the failures are not worth another. An attempt that
        stopped at a checkpoint when the driver asked (:class:`~spark_dist.errors.RunResized`: a preemption, an
        elastic run's grow) is followed by the next, not counted as a retry; preemptions have a budget of their
        own (``spark.dist.maxPreemptions``), and grows back off after one that fell short
        (:class:`~spark_dist.driver.elastic.ShortGrows`, ``spark.dist.maxShortGrows``)."""
        started = time.monotonic()
        failures_seen: List[RankFailure] = []  # the last attempt that failed (a resize is no failure)
        ended: List[RankFailure] = []  # how the last attempt ended: its failures, or rank 0's resize
        retries, previous_size, preemptions, short_grows = 0, 0, 0, elastic.ShortGrows(config)
        for attempt in itertools.count():
            if attempt and config.elastic and not config.local_mode:
                size = self._retry_size(config, spark, ended, previous_size, attempt, started)
            elif attempt:  # a lost executor may still be coming back
                self._wait_to_retry(config, spark, failures_seen, attempt, started)
            self._attempt_started(config, attempt, size, previous_size, ended)
            sized = config if size == config.num_processes else dataclasses.replace(
                config, num_processes=size, grow_wait=short_grows.wait_for(ended, size))
            # no eviction of these caches while the ranks read them; the job only once its slots are free
            queued_at = time.time()
            with prepare.not_evicted(handles), self._slots(spark, sized, attempt) as queued:
                started += queued  # waiting behind this process's other runs is not the run's time
                remaining = None if config.timeout is None else config.timeout - (time.monotonic() - started)
                # The store on the driver (classic session, local mode) or in the first task (Connect).
                running = Attempt(self, sized, backend, job_bytes, attempt, handles, checkpoint_dir, spark,
                                  remaining, Sizes(config.num_processes, previous_size))
                try:
                    outcome = running.run()
                except BaseException:  # Ctrl-C, a stopped trial: the attempt still took its time
                    self._attempt_times.append(times_of(running, attempt, size, queued_at, None))
                    raise
            self._attempt_times.append(times_of(running, attempt, size, queued_at, outcome))
            if outcome.failures is None:
                import cloudpickle

                if getattr(self, "_every_result", False):  # spark_dist.distributed: one value per rank
                    every = outcome.rank_results or {0: outcome.result_bytes}
                    result = [cloudpickle.loads(every[rank]) for rank in sorted(every)]
                else:
                    result = cloudpickle.loads(outcome.result_bytes)
                self._account(goodput.split(self._run_started, time.time(), self._attempt_times))
                self._summary(sized, attempt, time.monotonic() - started)
                if checkpoint_dirs.removed_after_success(config):  # the driver's own copy (local mode)
                    checkpoint_dirs.remove(checkpoint_dir)
                return result
            ended, previous_size = outcome.failures, size
            self._bar.close()
            if outcome.timed_out:
                raise (RunStalledError if outcome.stalled else RunTimeoutError)(ended, attempt + 1, config.run_id)
            backend = get_backend(config.backend, config)
            stop = elastic.stop_of(ended)
            if stop is not None:
                preemptions += elastic.is_preemption(stop)
                if preemptions > config.max_preemptions:
                    raise TrainingFailedError([elastic.too_many_preemptions(config, ended)], attempt + 1,
                                              config.run_id)
                continue
            previous, failures_seen = failures_seen, ended
            if retries < config.max_retries and worth_retrying(failures_seen, size, previous):
                retries += 1
                log.warning("spark_dist: attempt %d of run %s failed (%s); retrying", attempt, config.run_id,
                            root_cause(failures_seen).headline())
                continue
            raise TrainingFailedError(failures_seen, attempt + 1, config.run_id)
        raise AssertionError("unreachable")

    def _slots(self, spark, config: RunConfig, attempt: int):
        """The attempt's slots, as a context yielding the seconds waited for them: its own, held while its job
        runs; or, for a tuning trial, its lane's (a new lane after a failure or a resize, see
        :meth:`~spark_dist.driver.lanes.LaneHandle.ready`)."""
        if self._lane is not None:
            return self._lane.ready(fresh=attempt > 0)
        return slots.held(spark, config.num_tasks, config.local_mode)

    def _retry_size(self, config: RunConfig, spark, failures: List[RankFailure], previous_size: int,
                    attempt: int, started: float) -> int:
        """The next attempt's ranks (elastic runs): see :func:`spark_dist.driver.elastic.retry_size`."""
        wait = _retry_wait(config, started)
        try:
            # After a resize to grow, the stopped attempt's own tasks free their slots within seconds: give them
            # that long before settling for fewer ranks; after lost ranks, the hosts left free theirs at once.
            stop = elastic.stop_of(failures)
            grow = stop is not None and not elastic.is_preemption(stop)
            settle = min(wait, _GROW_SETTLE_S) if grow else config.abort_grace_period
            return elastic.retry_size(config, spark, previous_size, failures, wait, settle,
                                      settle if grow else elastic.STILL_S)
        except ConfigError as exc:
            raise ConfigError(f"run {config.run_id} could not be retried: {exc}; attempt {attempt - 1} had "
                              f"failed: {root_cause(failures).headline()}") from TrainingFailedError(
                                  failures, attempt, config.run_id)

    def _attempt_started(self, config: RunConfig, attempt: int, size: int, previous_size: int,
                         failures: List[RankFailure]) -> None:
        """An elastic run's size at its start and at each change: in the history, MLflow and the output."""
        record = elastic.resize_record(config, attempt, size, previous_size, failures)
        if record is None:
            return
        self.history.append(record)
        self._tracker.world_size(attempt, size)
        if attempt:
            log.warning("spark_dist: run %s continues on %d of %d ranks (%s)", config.run_id, size,
                        config.num_processes, record["reason"])
            if self.verbose:
                print(f"[spark_dist] run {config.run_id}: attempt {attempt} on {size} of {config.num_processes} "
                      f"ranks ({record['reason']})", flush=True)

    # ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _wait_for_slots(config: RunConfig, spark, timeout: Optional[float] = None) -> None:
        if not config.local_mode:
            from ..spark.resources import wait_for_slots

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
        wait = _retry_wait(config, started)
        try:
            self._wait_for_slots(config, spark, wait)
        except ConfigError as exc:
            raise ConfigError(
                f"run {config.run_id} could not be retried: {exc} after waiting {wait:g}s for the cluster to "
                f"replace lost executors (raise {CONF_RETRY_SLOT_WAIT}, or timeout=); attempt {attempt - 1} had "
                f"failed: {root_cause(failures).headline()}") from TrainingFailedError(failures, attempt, config.run_id)

    def _job_fields(self, train_object) -> Dict[str, Any]:
        """Further :class:`~spark_dist.wire.protocol.Job` fields a subclass sends its ranks (checked here,
        before any job)."""
        return {}

    def _session(self):
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None or self._args["local_mode"]:
            return active
        return SparkSession.builder.getOrCreate()

    def _on_poll(self) -> None:
        """Called at each of the driver's looks at a running attempt; what a subclass raises ends it."""


def _spark_conf(spark) -> Dict[str, str]:
    """The session's conf, with spark_dist's keys as set at run time (see :func:`session.conf_snapshot`)."""
    from .. import config as keys

    return session.conf_snapshot(spark, keys.RUNTIME_KEYS)


def _retry_wait(config: RunConfig, started: float) -> float:
    """How long a retry may wait for slots: ``spark.dist.retrySlotWaitTimeout``, within the run's timeout."""
    left = float("inf") if config.timeout is None else config.timeout - (time.monotonic() - started)
    return max(min(config.retry_slot_wait_timeout, left), 0.0)
