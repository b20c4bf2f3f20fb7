"""Start a classic session's Python workers while a run's driver-side work goes on.

A session's first Python job waits for its executors' Python daemon: under PySpark's own daemon, which imports
PySpark from Spark's zip, that daemon first compiles PySpark from source (one core, for seconds: BENCHMARKS.md,
Spark ML), and then each worker it forks imports what the job needs (torch, for a training run's ranks, which
are forked from the worker). A run that first writes a dataset cache (a JVM job, and driver-side planning) can
spend that wait beside the write: :func:`started_meanwhile` runs one small Python job in a thread of its own
while the block runs, whose workers import the modules the run's barrier tasks will; Spark reuses idle Python
workers (``spark.python.worker.reuse``, on by default), so the launch that follows finds them warm.

Nothing in the session changes: no conf, no daemon, no environment; the job is one more of the run's own, named
in the Spark UI and started under its own job group. It is started once per application by this process, only
on a classic session (under Connect a job description is a session-wide setting), and on a local master only
while the driver's JVM has started no Python worker yet. It never fails the run: an error is logged at debug
level and the launch starts the workers as it always does.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import uuid
from typing import Iterator, List, Sequence, Set

from . import jvm, session

logger = logging.getLogger(__name__)

DESCRIPTION = "spark_dist: start the Python workers"
# How long the block's end waits for the job: a job still waiting for slots then is left to finish alone
# (its thread is a daemon), and the launch queues behind it as behind any other job.
_JOIN_SECONDS = 60.0
_started_for: Set[str] = set()  # application ids this process has warmed (or found warm)
_lock = threading.Lock()


@contextlib.contextmanager
def started_meanwhile(spark, modules: Sequence[str], tasks: int) -> Iterator[None]:
    """Run the block while a job of ``tasks`` tasks (at most the session's slots on a local master) starts the
    session's Python workers and imports ``modules`` into each; wait for that job at the block's end.

    Does nothing under Spark Connect, for an application this process already warmed, or on a local master
    whose JVM already runs Python workers. Raises nothing of its own."""
    thread = _start(spark, tuple(modules), tasks)
    try:
        yield
    finally:
        if thread is not None:
            thread.join(_JOIN_SECONDS)


def _start(spark, modules: tuple, tasks: int):
    try:
        if session.is_connect(spark):
            return None
        sc = spark.sparkContext
        with _lock:
            if sc.applicationId in _started_for:
                return None
            _started_for.add(sc.applicationId)
        if session.is_local_master(spark):
            if jvm.python_workers_started(sc):
                return None
            slots = session.task_slots(spark)
            tasks = min(tasks, slots) if slots else tasks
    except Exception:  # noqa: BLE001 -- only a head start: the launch starts the workers anyway
        logger.debug("spark_dist: no early start of the Python workers", exc_info=True)
        return None
    thread = threading.Thread(target=_run, args=(spark, modules, max(1, tasks)), daemon=True,
                              name="spark_dist-start-python-workers")
    thread.start()
    return thread


def _run(spark, modules: tuple, tasks: int) -> None:
    try:
        with session.job_scope(spark, f"spark_dist-start-python-workers-{uuid.uuid4().hex[:8]}", DESCRIPTION):
            session.run_on_executors(spark, tasks, _importer(modules))
    except Exception:  # noqa: BLE001 -- see the module's docstring
        logger.debug("spark_dist: the early start of the Python workers failed", exc_info=True)


def _importer(modules: tuple):
    def import_modules(_task: int) -> List[str]:
        """In a Python worker: import what can be imported of ``modules``; the names that could not."""
        missing = []
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 -- the run's own import says what is wrong, where it matters
                missing.append(name)
        return missing
    return import_modules
