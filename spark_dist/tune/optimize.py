"""``optimize``: an Optuna study whose trials are spark_dist runs, several at once.

The driver runs Optuna's own ``study.optimize`` with ``n_jobs`` threads, one trial each; every trial's
objective is wrapped so that what it returns (the training of that trial) runs as a
:class:`~spark_dist.tune.trial_run.TrialRun` of ``num_processes`` ranks. On a classic session the trials run
on lanes (:mod:`spark_dist.driver.lanes`): one long-lived barrier job per trial running at once, whose tasks
fork each trial's ranks, so that a trial starts without a Spark job of its own. Optuna keeps doing what it does: the
sampler, the pruner, ``timeout``, ``callbacks`` (``study.stop()`` in one ends the study), heartbeats and stale
trials of an RDB storage, the trial states. The threads never ask for more slots than the cluster has
(``n_jobs`` is the slot count over the tasks of one trial, or ``max_concurrent``); each run also takes its
slots from :mod:`spark_dist.driver.slots`, so runs of this process started elsewhere are waited for, not
failed.
"""
from __future__ import annotations

import contextlib
import numbers
import threading
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

from ..config import RunConfig
from ..data import prepare
from ..driver import distributor as driver
from ..driver.lanes import LanePool
from ..spark import session
from ..errors import ConfigError, RunTimeoutError, TrainingFailedError
from .mlflow_runs import StudyRuns
from .objective import training_of, values_of
from .trial_run import Stopped, TrialRun


class TrialValueError(ValueError):
    """Rank 0 returned no value of the study's shape: the trial fails, the study goes on (as in Optuna)."""


def optimize(study, objective: Callable, n_trials: Optional[int] = None, *, num_processes: int = 1,
             metric: Optional[str] = None, max_concurrent: Optional[int] = None, timeout: Optional[float] = None,
             datasets: Optional[Dict[str, Any]] = None, use_gpu: bool = False, backend: str = "ddp",
             local_mode: bool = False, max_retries: int = 0, run_timeout: Optional[float] = None,
             checkpoint_dir: Optional[str] = None, catch: Sequence[type] = (),
             callbacks: Optional[Iterable[Callable]] = None, verbose: bool = False, spark=None):
    """Run ``n_trials`` trials of ``study``, each a distributed run of ``num_processes`` ranks, as many at once
    as the cluster's task slots allow.

    ``objective(trial)`` runs on the driver: it suggests the trial's parameters (``trial.suggest_float(...)``)
    and returns the training of that trial, which every rank then runs as under :meth:`Distributor.run`: a
    function, a ``.py`` script's path, or a tuple ``(train_object, args)`` / ``(train_object, args, kwargs)``.
    The trial's value is what rank 0 returned: a number (a sequence of numbers for a multi-objective study);
    where rank 0 returns ``None`` (a script), the last value of ``metric`` it reported.

    Args:
        study: an ``optuna.Study`` (``optuna.create_study(storage="sqlite:///study.db", load_if_exists=True)``
            keeps it across driver restarts; an ``RDBStorage`` with ``heartbeat_interval`` also fails the
            trials a dead driver left running, and its
            ``heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback()``
            runs them again).
        objective: ``objective(trial)`` -> the trial's training, as above.
        n_trials: trials to run in this call (``None``: until ``timeout``, or a callback's ``study.stop()``).
        num_processes: ranks of each trial (with ``use_gpu``, one GPU each).
        metric: the key of rank 0's ``ctx.report(...)`` whose values go to ``trial.report`` at the report's
            ``step``, ``global_step`` or ``epoch`` (else numbered in order), so that the study's pruner can
            stop a trial: its ranks are stopped and its slots freed. ``None``: no pruning. Single-objective only.
        max_concurrent: at most this many trials at once (default: as many as the slots allow; 1 with
            ``local_mode``, or where the slot count is unknown, under Spark Connect without the conf that says).
        timeout: seconds after which no trial is started (running ones finish), as in Optuna.
        datasets: ``{name: DataFrame}`` written once, before the first trial, and read by every trial's ranks
            (``ctx.loader(name)``).
        use_gpu, backend, local_mode, max_retries, checkpoint_dir, verbose: each trial's Distributor settings.
        run_timeout: seconds one trial's run may take (the Distributor's ``timeout``); a run that took longer
            is a failed trial.
        catch: further exception types that fail a trial without ending the study. A run that failed
            (:class:`TrainingFailedError`, :class:`RunTimeoutError`) or returned no usable value always does:
            the trial is ``FAIL``, its user attribute ``error`` holds the failing rank's error.
        callbacks: Optuna callbacks, ``callback(study, frozen_trial)`` after each trial.
        spark: the SparkSession (default: the active one).

    Returns:
        The study.

    Raises:
        ConfigError: a bad argument, naming it, before any Spark job; or a cluster with fewer task slots than
            one trial needs (after ``spark.dist.slotWaitTimeout``).
        KeyboardInterrupt: Ctrl-C: the running trials' jobs were cancelled and the trials marked failed.
        Whatever ``objective`` raised outside ``catch``, as ``study.optimize`` does.
    """
    optuna = _optuna()
    catch = (catch,) if isinstance(catch, type) else catch
    _check(optuna, study, objective, n_trials, metric, max_concurrent, timeout, run_timeout, datasets, catch,
           callbacks)
    run_args = dict(num_processes=num_processes, backend=backend, local_mode=local_mode, use_gpu=use_gpu,
                    max_retries=max_retries, timeout=run_timeout, checkpoint_dir=checkpoint_dir)
    RunConfig.build(arguments_only=True, **run_args)
    spark = driver.Distributor(local_mode=local_mode, spark=spark)._session()
    if not local_mode and spark is None:
        raise ConfigError("local_mode=False needs an active SparkSession (or pass spark=, or local_mode=True)")
    # One trial's settings with the session's conf (local mode: no session to read).
    config = None if local_mode else RunConfig.build(spark_conf=driver._spark_conf(spark), **run_args)
    n_jobs = _concurrency(spark, config, max_concurrent, n_trials)
    handles = prepare.prepare_datasets(spark, datasets, num_processes) if datasets else {}
    pool = _lane_pool(spark, config, n_jobs)
    runs = StudyRuns(study, {"n_trials": n_trials, "num_processes": num_processes, "metric": metric,
                             "max_concurrent": n_jobs, "direction": ",".join(d.name for d in study.directions)})
    live: set = set()
    state = {"stopping": False, "lock": threading.Lock()}

    def run_trial(trial):
        log = runs.trial(trial)
        try:
            spec = objective(trial)
            log.params()
            train_object, args, kwargs = training_of(spec, trial.number)
            with pool.lane() if pool is not None else contextlib.nullcontext() as lane:
                run = TrialRun(trial, metric, lane=lane, verbose=verbose, spark=spark, **run_args)
                with state["lock"]:
                    if state["stopping"]:
                        raise Stopped(f"trial {trial.number}: the study was interrupted")
                    live.add(run)
                try:
                    result = run.run(train_object, *args, datasets=handles or None, **kwargs)
                finally:
                    with state["lock"]:
                        live.discard(run)
                    if run.last_run_id is not None:
                        trial.set_user_attr("spark_dist_run_id", run.last_run_id)
                    if lane is not None and lane.current is not None:  # the job group of the lane that served it
                        trial.set_user_attr("spark_dist_lane", lane.current.tag)
            try:
                values = values_of(result, run.last_value, metric, len(study.directions), trial.number)
            except ValueError as exc:
                raise TrialValueError(str(exc)) from None
        except optuna.TrialPruned:
            log.end("PRUNED")
            raise
        except BaseException as exc:
            trial.set_user_attr("error", str(exc)[:20000])
            log.end("FAIL", error=str(exc))
            if state["stopping"] and not isinstance(exc, Stopped):  # a run ended by the interrupt
                raise Stopped(f"trial {trial.number}: the study was interrupted") from exc
            raise
        log.end("COMPLETE", values)
        return values

    catch = tuple(catch) + (TrainingFailedError, RunTimeoutError, TrialValueError)
    failed = True
    with prepare.not_evicted(handles):  # no eviction of the datasets' caches during the study
        try:
            _run_interruptibly(
                lambda: study.optimize(run_trial, n_trials=n_trials, timeout=timeout, n_jobs=n_jobs, catch=catch,
                                       callbacks=callbacks),
                lambda: _stop_all(state, live, spark, pool))
            failed = False
        finally:
            if pool is not None:
                pool.close()
            runs.end(study, failed=failed)
    return study


def _run_interruptibly(call: Callable[[], None], stop: Callable[[], None]) -> None:
    """``call()`` in a thread, so that Ctrl-C here stops the trials' runs (``stop``) before Optuna's thread
    pool waits for them; its exception re-raised here. (An event, not ``Thread.join``: a join that an interrupt
    cut short may take the thread for ended.)"""
    errors, done = [], threading.Event()

    def target():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name="spark_dist-tune", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        stop()
        done.wait()
        raise
    if errors:
        raise errors[0]


def _stop_all(state, live, spark, pool) -> None:
    with state["lock"]:
        state["stopping"] = True
        running = list(live)
    for run in running:
        run.stop(spark)
    if pool is not None:
        pool.cancel_all()


def _lane_pool(spark, config: Optional[RunConfig], n_jobs: int) -> Optional[LanePool]:
    """The study's lanes (:mod:`spark_dist.driver.lanes`): on a classic session, where the executors reach a
    store on the driver; ``None`` (each trial a job of its own) in local mode, under Spark Connect, and where
    ``spark.dist.storePort`` leaves too few ports for a store per lane besides one per running trial."""
    if config is None or session.is_connect(spark):
        return None
    if config.elastic:  # an attempt may have fewer ranks than a lane has tasks
        return None
    if config.store_ports is not None and config.store_ports[1] - config.store_ports[0] + 1 < 2 * n_jobs:
        return None
    return LanePool(spark, config)


def _concurrency(spark, config: Optional[RunConfig], max_concurrent: Optional[int], n_trials: Optional[int]) -> int:
    """How many trials run at once: the slots over one trial's tasks (``config``; ``None`` in local mode),
    within ``max_concurrent`` and ``n_trials``. Waits for the slots of one trial (``spark.dist.slotWaitTimeout``)
    as a run does.

    Raises:
        ConfigError: the cluster has fewer slots than one trial's tasks, naming ``num_processes``.
    """
    fit = None
    if config is not None:
        from ..spark.resources import wait_for_slots

        slots = wait_for_slots(spark, config.num_tasks, config.slot_wait_timeout, config.use_gpu,
                               config.processes_per_task)
        fit = None if slots is None else max(slots // config.num_tasks, 1)
    n = max_concurrent if max_concurrent is not None else (fit or 1)
    if fit is not None:
        n = min(n, fit)
    return max(1, min(n, n_trials) if n_trials else n)


def _check(optuna, study, objective, n_trials, metric, max_concurrent, timeout, run_timeout, datasets, catch,
           callbacks) -> None:
    """Raises ConfigError naming the first bad argument (before any Spark job)."""
    if not isinstance(study, optuna.Study):
        raise ConfigError(f"study must be an optuna.Study (optuna.create_study(...)), got {type(study).__name__}")
    if not callable(objective):
        raise ConfigError(f"objective must be a function of the trial, got {type(objective).__name__}")
    for name, value in (("n_trials", n_trials), ("max_concurrent", max_concurrent)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
    for name, value in (("timeout", timeout), ("run_timeout", run_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0):
            raise ConfigError(f"{name} must be a positive number of seconds or None, got {value!r}")
    if metric is not None:
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"metric must be the name of a reported value, got {metric!r}")
        if len(study.directions) > 1:
            raise ConfigError("metric= (pruning) needs a single-objective study: Optuna cannot prune a "
                              f"multi-objective one ({len(study.directions)} directions)")
    if datasets is not None and not isinstance(datasets, dict):
        raise ConfigError(f"datasets must be a dict of name -> DataFrame, got {type(datasets).__name__}")
    try:
        kinds = tuple(catch)
    except TypeError:
        kinds = None
    if kinds is None or not all(isinstance(c, type) and issubclass(c, BaseException) for c in kinds):
        raise ConfigError(f"catch must be a sequence of exception types, got {catch!r}")
    if callbacks is not None and not all(callable(c) for c in callbacks):
        raise ConfigError("callbacks must be functions callback(study, frozen_trial)")


def _optuna():
    try:
        import optuna
    except ImportError as exc:
        raise ConfigError("spark_dist.tune needs Optuna: pip install optuna") from exc
    return optuna
