"""What spark_dist asks of a Spark session, on a classic session or under Spark Connect.

A classic session has a SparkContext in this process: its conf, slot count and executor hosts come through
PySpark's private py4j handles (:mod:`spark_dist.spark.jvm`). A Spark Connect session is a thin client of a
remote driver: only the DataFrame API and ``spark.conf`` exist. spark_dist's jobs use the DataFrame API on both
(``mapInArrow``), so their tasks run in the Python workers the session's SQL UDFs use, and the two kinds
differ only in how a job is named and cancelled (:func:`job_scope`, :func:`cancel`). Every question that has no
Connect API gets an honest substitute here, said in each function's docstring.

Which kind a session is: the session's own class (:func:`is_connect`). PySpark's ``is_remote()`` tells
whether this *process* runs Spark Connect; :meth:`spark_dist.Distributor.run` uses it to find the active
session when none is given, and a process may hold both kinds at once (a test suite does).
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

from . import jvm


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote("sc://...")``)."""
    if spark is None or type(spark).__module__ == "pyspark.sql.session":
        return False
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # a pyspark without Connect's client packages (grpcio): no such session exists
        return False
    return isinstance(spark, ConnectSession)


_context_conf_cache: Dict[str, Dict[str, str]] = {}


def conf_snapshot(spark, runtime_keys: Iterable[str] = ()) -> Dict[str, str]:
    """The session's Spark conf as a dict. On a classic session: the SparkContext's conf (fixed once the
    context runs, so read once per context: py4j calls cost on the launch path), with ``runtime_keys``
    also taken from the session's runtime conf (``spark.conf.set("spark.dist.checkpointDir", ...)`` in a
    notebook works). Under Connect: ``spark.conf.getAll`` (one round trip), which holds the keys that were
    set (the server's static conf and this session's)."""
    if spark is None:
        return {}
    if is_connect(spark):
        return dict(spark.conf.getAll)
    sc = spark.sparkContext
    key = sc.applicationId  # not id(): a stopped context's address may be reused by the next one
    if key not in _context_conf_cache:
        _context_conf_cache.clear()  # one live SparkContext per process
        _context_conf_cache[key] = dict(sc.getConf().getAll())
    conf = dict(_context_conf_cache[key])
    for name in runtime_keys:
        value = spark.conf.get(name, None)
        if value is not None:
            conf[name] = value
    return conf


def master(spark) -> str:
    return spark.conf.get("spark.master", "") if is_connect(spark) else spark.sparkContext.master


def app_id(spark) -> str:
    """The application's id (caches are kept per application)."""
    return spark.conf.get("spark.app.id") if is_connect(spark) else spark.sparkContext.applicationId


def driver_resources(spark) -> Dict[str, Any]:
    """The driver's Spark resources (``spark.driver.resource.*``: name -> ResourceInformation), as PySpark's
    TorchDistributor reads them; under Connect the server's driver's."""
    if is_connect(spark):
        return dict(spark._client._resources())
    return dict(spark.sparkContext.resources)


def is_local_master(spark) -> bool:
    name = master(spark)
    return name == "local" or name.startswith("local[")


def task_slots(spark, conf: Optional[Dict[str, str]] = None) -> Optional[int]:
    """Tasks the cluster can run at once, as Spark's own barrier check counts them; ``None`` when unknown.

    Classic: the scheduler's count (CPU and GPU amounts both count). Spark Connect has no API for it; the
    substitute is the conf: ``local[N]`` has N slots, ``local-cluster[E,C,M]`` E*C/``spark.task.cpus``, and
    a cluster with ``spark.executor.instances`` and ``spark.executor.cores`` set has their product over
    ``spark.task.cpus``, bounded by the executors' GPUs over ``spark.task.resource.gpu.amount`` when tasks take
    GPUs. Otherwise (``local[*]``, dynamic allocation) it is unknown, and Spark's own barrier check is the one
    that applies. The count follows the conf, not the executors alive: a retry under Connect does not wait
    for lost executors to come back.
    """
    if not is_connect(spark):
        return jvm.max_concurrent_tasks(spark.sparkContext)
    return slots_from_conf(conf_snapshot(spark) if conf is None else conf)


def free_task_slots(spark) -> Optional[int]:
    """Task slots free now on a classic session (:func:`~spark_dist.spark.jvm.free_task_slots`); ``None`` under
    Spark Connect, which has no API for it."""
    if is_connect(spark):
        return None
    return jvm.free_task_slots(spark.sparkContext)


def decommissioning_hosts(spark) -> Optional[Dict[str, str]]:
    """Executor id -> host of the executors being decommissioned now on a classic session
    (:func:`~spark_dist.spark.jvm.decommissioning_executors`); ``None`` under Spark Connect, which has no API
    for it, and where the scheduler's record cannot be read (another Spark line's internals)."""
    if is_connect(spark):
        return None
    try:
        return jvm.decommissioning_executors(spark.sparkContext)
    except Exception:  # noqa: BLE001 -- Spark internals through py4j: no notices rather than a failed run
        return None


def stage_executors(spark, stage: int) -> Optional[Set[str]]:
    """The ids of the executors running stage ``stage``'s tasks on a classic session; ``None`` under Spark
    Connect or where the status store cannot be read."""
    if is_connect(spark) or stage < 0:
        return None
    try:
        return jvm.stage_executors(spark.sparkContext, stage)
    except Exception:  # noqa: BLE001 -- Spark internals through py4j: fall back to the hosts
        return None


def replace_lost_executors(spark, stage: int, partitions) -> List[str]:
    """Have Spark replace the executors that ran tasks ``partitions`` of stage ``stage`` on a classic session,
    whose host went silent (:func:`~spark_dist.spark.jvm.replace_executor`): the next attempt's tasks then go to
    the executors left, not to one that can no longer hear the driver, as Spark would place them until its own
    executor timeout. The ids Spark took; none under Spark Connect or where the status store cannot say."""
    by_task = stage_task_executors(spark, stage) or {}
    replaced = []
    for executor in sorted({by_task[p] for p in partitions if p in by_task}):
        try:
            if jvm.replace_executor(spark.sparkContext, executor):
                replaced.append(executor)
        except Exception:  # noqa: BLE001 -- Spark internals through py4j: Spark's own timeout still applies
            continue
    return replaced


def stage_task_executors(spark, stage: int) -> Optional[Dict[int, str]]:
    """Task index -> the id of the executor running it, for stage ``stage`` on a classic session
    (:func:`~spark_dist.spark.jvm.stage_task_executors`); ``None`` under Spark Connect or where the status store
    cannot be read."""
    if is_connect(spark) or stage < 0:
        return None
    try:
        return jvm.stage_task_executors(spark.sparkContext, stage)
    except Exception:  # noqa: BLE001 -- Spark internals through py4j: the caller falls back
        return None


def slots_from_conf(conf: Dict[str, str]) -> Optional[int]:
    """The slot count the conf tells (see :func:`task_slots`), ``None`` when it does not; a pure function."""
    name = conf.get("spark.master", "")
    task_cpus = int(conf.get("spark.task.cpus", "1") or 1)
    if name == "local":
        return 1
    local = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", name)
    if local:
        return int(local.group(1)) // task_cpus
    cluster = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", name)
    if cluster:
        executors, cores = int(cluster.group(1)), int(cluster.group(2))
    else:
        instances, cores_conf = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
        if not (instances and cores_conf) or conf.get("spark.dynamicAllocation.enabled", "false") == "true":
            return None
        executors, cores = int(instances), int(cores_conf)
    slots = executors * (cores // task_cpus)
    task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0") or 0)
    if task_gpus > 0:  # each task also needs its GPUs: as many slots as the executors' GPUs allow
        executor_gpus = float(conf.get("spark.executor.resource.gpu.amount", "0") or 0)
        slots = min(slots, executors * int(executor_gpus // task_gpus))
    return slots


def executor_hosts(spark) -> Optional[List[str]]:
    """The hosts of the executors registered now (the driver's entry included); no Spark job. ``None``
    under Spark Connect, which has no API for it (the cache check asks the executors with a job; the
    checkpoint warning assumes they may be elsewhere)."""
    if is_connect(spark):
        return None
    return jvm.executor_hosts(spark.sparkContext)


def run_on_executors(spark, tasks: int, fn: Callable[[int], List[Any]]) -> List[Any]:
    """Run ``fn(task_index)`` in ``tasks`` Spark tasks (one small ``mapInArrow`` job, not barrier); its lists,
    joined. The tasks run in the Python workers the session's SQL UDFs use, on either kind of session."""
    return collect_records(task_stage(spark, tasks, _arrow_task(fn)))


def _arrow_task(fn: Callable[[int], List[Any]]):
    def task(batches):
        from pyspark import TaskContext

        for _ in batches:
            pass
        yield records_batch(fn(TaskContext.get().partitionId()))
    return task


# What a task returns through the DataFrame API (a mapInArrow job): its records, pickled, one per row.
RECORDS_SCHEMA = "record binary"
# PySpark 4 warns, on every new call site, that it does not fully support pandas 3; it said so already when
# the session started, and a barrier stage's ``mapInArrow`` uses no pandas.
_PANDAS_3_NOTICE = "PySpark does not yet fully support pandas >= 3"


def task_stage(spark, tasks: int, fn, schema: str = RECORDS_SCHEMA, barrier: bool = False):
    """The DataFrame of a stage of ``tasks`` tasks (a barrier stage with ``barrier``), each running ``fn`` (a
    ``mapInArrow`` function) over its one-row partition; ``schema``: what ``fn`` yields. Built without PySpark's
    pandas-3 notice, which only this call would repeat (the filter is scoped to the call)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PANDAS_3_NOTICE, category=FutureWarning)
        return spark.range(0, tasks, 1, tasks).mapInArrow(fn, schema, barrier=barrier)


def records_batch(records: List[Any]):
    """``records`` as the Arrow batch a task yields (large_binary: a result may pass 2 GiB, binary's offsets
    are 32-bit)."""
    import pickle

    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"record": [pickle.dumps(r) for r in records]},
                                      schema=pa.schema([("record", pa.large_binary())]))


def records_of(rows) -> List[Any]:
    """The records of a job's collected rows (see :func:`records_batch`)."""
    import pickle

    return [pickle.loads(row[0]) for row in rows]


def collect_records(frame) -> List[Any]:
    """Run ``frame``, a job whose tasks yield :func:`records_batch` batches, and return their records in
    partition order. Fetched as Arrow (``toArrow``; a classic PySpark 3.5 session's ``_collect_as_arrow``)
    rather than as rows, so a large result crosses the driver's JVM without a row per record and the copies
    that row makes; ``collect()`` where neither exists (a PySpark 3.5 Connect client).

    Raises:
        Exception: what the job raised (a failed stage, a cancelled job), as PySpark raises it.
    """
    import pickle

    if hasattr(frame, "toArrow"):  # PySpark >= 4.0, classic and Connect
        values = frame.toArrow().column(0).to_pylist()
    elif hasattr(frame, "_collect_as_arrow"):  # classic PySpark 3.5
        values = [value for batch in frame._collect_as_arrow() for value in batch.column(0).to_pylist()]
    else:
        return records_of(frame.collect())
    return [pickle.loads(value) for value in values]


@contextlib.contextmanager
def job_scope(spark, tag: str, description: str):
    """Start this thread's jobs, inside the block, under ``tag`` (for :func:`cancel`), named ``description`` in
    the Spark UI; the thread's settings are restored after it.

    Classic: ``tag`` is the job group (``sc.setJobGroup``, interrupting the tasks on cancel), which the UI's
    kill link and a user's ``sc.cancelJobGroup(tag)`` also reach; the description is the group's. Connect: a job
    tag, and ``spark.job.description``, a session-wide setting there, set only when the user has set none (theirs
    is theirs to keep) and unset after unless someone replaced it meanwhile."""
    if not is_connect(spark):
        sc = spark.sparkContext
        sc.setJobGroup(tag, description, True)
        try:
            yield
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
                sc.setLocalProperty(key, None)  # type: ignore[arg-type] -- None removes it
        return
    spark.addTag(tag)  # tags belong to the thread that starts the operation
    described = _describe_jobs(spark, description)
    try:
        yield
    finally:
        spark.removeTag(tag)
        if described:
            _undescribe_jobs(spark, description)


def _describe_jobs(spark, description: str) -> bool:
    """Set ``spark.job.description`` (Connect) unless the user set one; returns whether ours was set."""
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


def cancel(spark, tag: str) -> None:
    """Cancel the jobs started under ``tag`` (:func:`job_scope`: a job group on a classic session, a tag under
    Connect)."""
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobGroup(tag)


def list_files(spark, url: str) -> List[str]:
    """The Parquet data files directly under ``url`` as Spark lists them (any scheme Spark reads); no job.
    Under Connect: the files of ``spark.read.parquet(url)`` (``inputFiles``, planned on the server)."""
    if is_connect(spark):
        return list(spark.read.parquet(url).inputFiles())
    return jvm.list_files(spark.sparkContext, url)


def file_identity(spark, url: str) -> tuple:
    """``(length, modification time)`` of the file at ``url`` (any scheme Spark reads). Under Connect,
    where the client may not reach the file system: Spark's ``binaryFile`` source reads the two fields from
    the file's status (a small job)."""
    if is_connect(spark):
        row = spark.read.format("binaryFile").load(url).select("length", "modificationTime").first()
        return (int(row[0]), str(row[1])) if row is not None else (-1, -1)
    return jvm.file_identity(spark.sparkContext, url)
