"""The one place spark_dist reaches into the driver JVM through PySpark's private py4j handles.

PySpark has no public API for these (on either Spark line): the scheduler's concurrent-task count, the
registered executors' hosts, the executors being decommissioned, a DataFrame's analyzed plan (to find the cache a user's own Petastorm converter
made of it), Hadoop's FileSystem (to list and move files in any scheme Spark itself writes), the JVM's child
processes (has a Python daemon started?). The handles used (``sc._jsc``,
``sc._jvm``, ``df._jdf``) are the same on Spark 3.5 and 4.x; keeping them here makes them easy to check
when a Spark line moves, and marks what a session without a JVM (Spark Connect) must do otherwise.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set


def max_concurrent_tasks(sc) -> int:
    """Tasks the cluster can run at once under the default resource profile (CPU and GPU amounts both
    count), as Spark's own barrier slot check computes it."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def free_task_slots(sc) -> int:
    """Slots free now: :func:`max_concurrent_tasks` less the tasks running on the executors it counts, as Spark's
    own books have them. A task on an executor that went silent stays running there until Spark declares the
    executor lost, so a lost host's slots are never counted free before that; an executor Spark is removing
    (:func:`replace_executor`) counts neither its slots nor its tasks."""
    jsc = sc._jsc.sc()
    backend = jsc.schedulerBackend()
    running, executors = 0, jsc.statusStore().executorList(True).iterator()
    while executors.hasNext():
        executor = executors.next()
        if executor.id() == "driver" or _active(backend, executor.id()):
            running += int(executor.activeTasks())
    return max(0, max_concurrent_tasks(sc) - running)


def _active(backend, executor: str) -> bool:
    """Whether the cluster backend still offers ``executor``'s slots (local mode's backend has no such state)."""
    try:
        return bool(backend.isExecutorActive(executor))
    except Exception:  # noqa: BLE001 -- a backend without the method (local mode): every executor is
        return True


def replace_executor(sc, executor: str) -> bool:
    """Ask Spark to kill executor ``executor`` and its cluster manager for another in its place, what Spark does
    itself once the executor's heartbeats lapse for ``spark.network.timeout``; at once, its slots are offered to
    no task again. Returns whether Spark took the request (False: the executor is gone already, or the
    backend cannot kill executors)."""
    return bool(sc._jsc.sc().killAndReplaceExecutor(executor))


def decommissioning_executors(sc) -> Dict[str, str]:
    """Executor id -> host of the executors Spark is decommissioning now (a standalone worker's decommission
    script, a YARN node draining, a Kubernetes pod being deleted with ``spark.decommission.enabled``); no Spark
    job. The driver learns it from the cluster manager within a second and keeps it until the executor is gone;
    no listener event says it, so the task scheduler's own record is read."""
    scheduler = sc._jsc.sc().taskScheduler()
    pending = scheduler.executorsPendingDecommission()
    if pending.isEmpty():
        return {}
    found = {}
    ids = pending.keySet().iterator()
    while ids.hasNext():
        executor = ids.next()
        state = scheduler.getExecutorDecommissionState(executor)
        if not state.isDefined():
            continue
        host = state.get().workerHost()  # standalone names the worker's host; YARN and Kubernetes do not
        if host.isDefined():
            found[executor] = host.get()
        else:
            summary = sc._jsc.sc().statusStore().executorSummary(executor)
            found[executor] = summary.hostPort().rsplit(":", 1)[0]
    return found


def stage_executors(sc, stage: int) -> Set[str]:
    """The ids of the executors that ran tasks of attempt 0 of stage ``stage`` (the status store's); no Spark
    job."""
    summaries = sc._jsc.sc().statusStore().executorSummary(stage, 0)
    ids = summaries.keys().iterator()
    found = set()
    while ids.hasNext():
        found.add(ids.next())
    return found


_MAX_TASKS = 1 << 30  # taskList's bound (a Scala Int): every task of the stage


def stage_task_executors(sc, stage: int) -> Dict[int, str]:
    """Task index -> executor id of attempt 0 of stage ``stage``'s tasks, as the status store records them when
    each task starts (unlike the stage's executor summaries, written at the store's next flush); no Spark job."""
    tasks = sc._jsc.sc().statusStore().taskList(stage, 0, _MAX_TASKS).iterator()
    found = {}
    while tasks.hasNext():
        task = tasks.next()
        found[int(task.index())] = str(task.executorId())
    return found


def executor_hosts(sc) -> List[str]:
    """The hosts of the executors registered now (the driver's entry included); no Spark job."""
    return [info.host() for info in sc._jsc.sc().statusTracker().getExecutorInfos()]


def analyzed_plan(df) -> Any:
    """The analyzed logical plan of ``df``, as Petastorm's converter keeps it (``meta.df_plan``):
    ``plan.sameResult(other)`` tells whether two DataFrames hold the same data."""
    return df._jdf.queryExecution().analyzed()


def hadoop_filesystem(sc, path: str):
    """``(FileSystem, Path)`` for ``path`` through the SparkContext's Hadoop configuration."""
    jpath = sc._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(sc._jsc.hadoopConfiguration()), jpath


def list_files(sc, url: str) -> List[str]:
    """The file URLs directly under ``url`` (any scheme Spark reads), as Hadoop writes them; no Spark job."""
    fs, jpath = hadoop_filesystem(sc, url)
    return [status.getPath().toUri().toString() for status in fs.listStatus(jpath) if status.isFile()]


def file_identity(sc, url: str) -> tuple:
    """``(length, modification time)`` of the file at ``url`` (any scheme Spark reads)."""
    fs, jpath = hadoop_filesystem(sc, url)
    status = fs.getFileStatus(jpath)
    return int(status.getLen()), int(status.getModificationTime())


def write_bytes(sc, path: str, data: bytes) -> None:
    """Write ``data`` as a new file at ``path`` (any scheme Spark writes); fails if it exists."""
    fs, jpath = hadoop_filesystem(sc, path)
    out = fs.create(jpath, False)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_bytes(sc, path: str) -> bytes:
    """The whole file at ``path`` (any scheme Spark reads)."""
    fs, jpath = hadoop_filesystem(sc, path)
    stream = fs.open(jpath)
    try:
        return bytes(sc._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def python_workers_started(sc) -> bool:
    """Whether the driver's JVM has a Python daemon or worker running: a child process run with ``-m <module>``,
    as Spark starts both. A spark-submit driver (a script) does not count, unless its own arguments hold
    ``-m``: a false "started", the safe side. A child whose command line cannot be read (one exiting: Hadoop's
    shell commands come and go) does not count either. Java 9 or later (``ProcessHandle``)."""
    for child in sc._jvm.java.lang.ProcessHandle.current().children().toArray():
        arguments = child.info().arguments()
        if arguments.isPresent() and "-m" in list(arguments.get()):
            return True
    return False
