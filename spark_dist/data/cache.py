"""The driver side: check each DataFrame, materialise it once through Petastorm's converter, clean up after.

Where the cache lives: ``petastorm.spark.converter.parentCacheDirUrl`` (the key Petastorm reads) when set,
else a fresh directory under ``spark.local.dir`` or the system temp dir, as a ``file://`` URL.
Executors write the cache and ranks read it, so it must be a filesystem all of them see. The default
``file://`` directory works with ``local[N]``, ``local-cluster`` and a standalone cluster whose workers all
run on the driver's machine; when an executor runs on another host, :func:`prepare_datasets` refuses it
before any job. A ``file:`` directory the user named (an NFS mount, ``/dbfs``) is accepted once every
executor host was seen to find a marker file the driver wrote there.
"""
import atexit
import functools
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlparse

from .. import jvm, tempdirs
from .handle import (ARRAY, SCALAR, VECTOR, ColumnStats, DatasetError, DatasetHandle, describe_files, local_path,
                     open_parquet, readable_url)

# Petastorm 0.12 uses pyarrow APIs that pyarrow 14 marks deprecated; the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm\.")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"petastorm\.")

logger = logging.getLogger(__name__)

CACHE_DIR_CONF = "petastorm.spark.converter.parentCacheDirUrl"


@dataclass
class _Entry:
    app_id: str
    parent_url: str
    plan: Any             # the analyzed JVM plan of the user's DataFrame: sameResult() finds it again
    inputs: tuple         # the files it reads, with sizes and modification times (see _input_files)
    converter: Any        # petastorm SparkDatasetConverter
    handle: DatasetHandle
    owned: bool           # False when Petastorm handed back a cache the user made: never delete that


@dataclass
class _Write:
    """A cache being written now: another thread preparing the same plan waits for ``done``."""

    app_id: str
    parent_url: str
    plan: Any
    inputs: tuple
    done: threading.Event


def _same_data(item, app_id: str, parent_url: str, plan, inputs: tuple) -> bool:
    """``item`` (an :class:`_Entry` or a :class:`_Write`) holds ``plan``'s data for this application and dir:
    the same plan over the same files, unchanged (a re-read of a path whose files changed has the same plan)."""
    return (item.app_id == app_id and item.parent_url == parent_url and item.inputs == inputs
            and item.plan.sameResult(plan))


def _input_files(spark, df) -> tuple:
    """``((url, length, modification time), ...)`` of the files ``df`` reads (``DataFrame.inputFiles``, no
    Spark job): rewritten, added or removed files make another cache key."""
    identity = []
    for url in sorted(df.inputFiles()):
        path = local_path(url)
        if path is not None:
            try:
                info = os.stat(path)
                identity.append((url, info.st_size, info.st_mtime_ns))
            except OSError:  # gone already: the write will say so; no cache can match it meanwhile
                identity.append((url, -1, -1))
        else:
            identity.append((url, *jvm.file_identity(spark.sparkContext, url)))
    return tuple(identity)


_lock = threading.RLock()
_entries: List[_Entry] = []
_writing: List["_Write"] = []           # the writes under way
_in_use: Dict[str, int] = {}            # cache dir URL -> runs reading it now (never evicted meanwhile)
_default_parent: Optional[str] = None   # the directory this process created when the conf was not set
_owner_pid = os.getpid()                # forked children inherit this module's state, not its caches
_atexit_registered = False
# Caches kept per application, least recently used evicted first: a Pipeline or CrossValidator makes a new
# DataFrame (a new plan) on every fit, so without a bound the caches of a tuning run would pile up on disk.
MAX_CACHED_DATASETS = 8


# -- schema (no Spark job) ----------------------------------------------------------------------------------
def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def column_kinds(name: str, df) -> Dict[str, str]:
    """``{column: "scalar" | "array" | "vector"}`` from the schema alone.

    Raises:
        DatasetError: a column of another type (string, struct, map, decimal, nested array, ...), duplicate
            column names, or no columns.
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT
    from pyspark.sql import types as T

    numbers = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.BooleanType)
    kinds: Dict[str, str] = {}
    for field in df.schema.fields:
        t = field.dataType
        if field.name in kinds:
            raise DatasetError(f"dataset {name!r}: column name {field.name!r} appears twice; rename one")
        if isinstance(t, (VectorUDT, OldVectorUDT)):
            kinds[field.name] = VECTOR
        elif isinstance(t, numbers):
            kinds[field.name] = SCALAR
        elif isinstance(t, T.ArrayType) and isinstance(t.elementType, numbers):
            kinds[field.name] = ARRAY
        else:
            hint = ("cast it to double: F.col(...).cast('double')"
                    if isinstance(t, T.DecimalType) or (isinstance(t, T.ArrayType)
                                                        and isinstance(t.elementType, T.DecimalType))
                    else f"drop it (df.drop({field.name!r})) or turn it into numbers first "
                         "(e.g. StringIndexer, VectorAssembler)")
            raise DatasetError(
                f"dataset {name!r}: column {field.name!r} has type {t.simpleString()}, which the loader cannot "
                "turn into a tensor (supported: numeric scalars, arrays of numbers, pyspark.ml.linalg vectors); "
                + hint)
    if not kinds:
        raise DatasetError(f"dataset {name!r}: the DataFrame has no columns")
    return kinds


# -- where the cache goes -----------------------------------------------------------------------------------
def _parent_url(spark) -> str:
    global _default_parent
    url = spark.conf.get(CACHE_DIR_CONF, None)
    if url:
        if not urlparse(url).scheme:
            raise DatasetError(f"{CACHE_DIR_CONF}={url!r} has no scheme; write it as a URL, e.g. "
                               f"'file://{url}' or 'hdfs://...'")
        readable_url(url)  # before the write: a scheme the ranks cannot read is refused now, naming the key
        return url.rstrip("/")
    with _lock:
        if _default_parent is None or not os.path.isdir(_default_parent):
            local_dirs = (spark.sparkContext.getConf().get("spark.local.dir") or "").split(",")
            base = next((d for d in local_dirs if d and os.path.isdir(d)), tempfile.gettempdir())
            _default_parent = tempdirs.make("cache", parent=base)  # also sweeps those of dead drivers
        return "file://" + _default_parent


def remote_hosts(driver_host: str, executor_hosts: Iterable[str]) -> List[str]:
    """The executor hosts that are not the driver's machine (loopback and the machine's own names count
    as the driver's). A pure function, so the multi-host rule is testable on one machine."""
    own = {driver_host, "localhost", socket.gethostname()}
    own_ips: set = set()

    def ips(host: str) -> set:
        try:
            return {ipaddress.ip_address(host).compressed}
        except ValueError:
            try:
                return {ai[4][0] for ai in socket.getaddrinfo(host, None)}
            except OSError:
                return set()

    def is_own(host: str) -> bool:
        if host in own:
            return True
        addrs = ips(host)
        if addrs and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
            return True
        if not own_ips:  # resolved only when a name is not obviously ours: lookups can be slow
            for h in own:
                own_ips.update(ips(h))
        return bool(addrs) and addrs <= own_ips

    return sorted({h for h in executor_hosts if not is_own(h)})


def _check_reachable(spark, parent_url: str) -> None:
    """Refuse a ``file:`` cache that executors on other hosts cannot see, before any write.

    The default directory (on the driver's disk) is refused outright when executors run elsewhere. A
    directory the user named in the conf may be a shared mount (NFS, ``/dbfs``): the executors are asked
    whether they see a marker file the driver writes there (one small Spark job, once per directory and
    application).
    """
    sc = spark.sparkContext
    master = sc.master
    if master == "local" or master.startswith("local[") or urlparse(parent_url).scheme != "file":
        return
    driver_host = sc.getConf().get("spark.driver.host") or socket.gethostname()
    from ..resources import executor_hosts

    hosts = executor_hosts(sc)
    far = remote_hosts(driver_host, hosts)
    if far and not spark.conf.get(CACHE_DIR_CONF, None):
        raise DatasetError(
            f"the dataset cache {parent_url} is on the driver's local disk, but executors run on other hosts "
            f"({', '.join(far)}) and could neither write it nor read it; set {CACHE_DIR_CONF} to a filesystem "
            "every executor sees (hdfs://..., s3a://..., or file:/dbfs/... or an NFS mount present on all hosts)")
    if far and (sc.applicationId, parent_url) not in _seen_by_executors:
        blind = _hosts_not_seeing(sc, local_path(parent_url), len(hosts))
        if blind:
            raise DatasetError(
                f"{CACHE_DIR_CONF}={parent_url}: executors on {', '.join(blind)} do not see this directory (a "
                "marker file the driver wrote there was not found); mount it on every host or set the key to "
                "a filesystem every executor sees (hdfs://..., s3a://...)")
        _seen_by_executors.add((sc.applicationId, parent_url))
    if len(hosts) <= 1:
        logger.warning("spark_dist: no executor has registered yet, so cannot check that they all see the "
                       "dataset cache %s; on a multi-host cluster set %s to a shared filesystem",
                       parent_url, CACHE_DIR_CONF)


_seen_by_executors: set = set()  # (application id, cache dir URL) that every executor host was seen to see


def _hosts_not_seeing(sc, directory: str, executors: int) -> List[str]:
    """The executor hosts on which ``directory`` lacks the marker file the driver writes there now."""
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, f".spark_dist-marker-{uuid.uuid4().hex}")
    with open(marker, "w") as f:
        f.write("written by the spark_dist driver to check that executors share this directory\n")
    try:
        tasks = max(2 * executors, 2)  # enough tasks that every executor runs one

        def look(_):
            import os as _os

            host = _os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()
            return [(host, _os.path.exists(marker))]

        seen = sc.parallelize(range(tasks), tasks).mapPartitions(look).collect()
    finally:
        os.unlink(marker)
    return sorted({host for host, found in seen if not found})


# -- materialise, checking the values on the way (one Spark job) --------------------------------------------
def _value_exprs(df_schema, kinds: Dict[str, str], ranges: Iterable[str] = ()) -> list:
    """Aggregations that check a dataset's values: row count; per column nulls; for arrays and vectors the
    min/max length and rows holding null elements; for the number columns in ``ranges`` (what a caller checks
    labels against) min/max, NaNs and non-integers. Only those: every aggregate costs on every row."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    exprs = [F.count(F.lit(1)).alias("rows")]
    nullable = {f.name: f.nullable for f in df_schema.fields}
    types = {f.name: f.dataType for f in df_schema.fields}
    for i, (column, kind) in enumerate(kinds.items()):
        col = F.col(_quoted(column))
        if nullable[column] or kind == VECTOR:
            exprs.append(F.sum(col.isNull().cast("long")).alias(f"null{i}"))
        if kind == SCALAR:
            if column not in ranges:
                continue
            value = col.cast("double")
            if isinstance(types[column], (T.FloatType, T.DoubleType)):
                finite = F.when(~F.isnan(value), value)  # Spark orders NaN above every number: count it apart
                exprs += [F.min(finite).alias(f"lo{i}"), F.max(finite).alias(f"hi{i}"),
                          F.sum(F.isnan(value).cast("long")).alias(f"nan{i}"),
                          F.sum((finite != F.floor(finite)).cast("long")).alias(f"frac{i}")]
            else:
                exprs += [F.min(value).alias(f"lo{i}"), F.max(value).alias(f"hi{i}")]
        else:
            size = F.when(col.isNotNull(), F.size(col))
            exprs += [F.min(size).alias(f"min{i}"), F.max(size).alias(f"max{i}"),
                      F.sum(F.exists(col, lambda x: x.isNull()).cast("long")).alias(f"inner{i}")]
    return exprs


def _with_arrays(df, kinds: Dict[str, str]):
    """Vectors as dense float32 arrays, as the cache stores them: sparse vectors would not reshape per batch."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    return df.select([vector_to_array(F.col(_quoted(c)), "float32").alias(c) if kinds[c] == VECTOR
                      else F.col(_quoted(c)) for c in df.columns])


def _as_float32(df):
    """Doubles (and arrays of doubles) as float32, as Petastorm's converter stores them; done here with quoted
    names because Petastorm's own pass reads ``df[name]``, which takes a dot in a name for a struct field."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def narrowed(field):
        col = F.col(_quoted(field.name))
        if isinstance(field.dataType, T.DoubleType):
            return col.cast("float").alias(field.name)
        if isinstance(field.dataType, T.ArrayType) and isinstance(field.dataType.elementType, T.DoubleType):
            return col.cast("array<float>").alias(field.name)
        return col
    return df.select([narrowed(f) for f in df.schema.fields])


def _users_petastorm_cache(plan, parent_url: str) -> Optional[str]:
    """The cache a ``make_spark_converter`` call of the user's already made of this very DataFrame (the
    analyzed ``plan``; with the settings we use), which we read but never delete."""
    from petastorm.spark import spark_dataset_converter as psc

    with psc._cache_df_meta_list_lock:
        for meta in psc._cache_df_meta_list:
            if (meta.row_group_size == psc.DEFAULT_ROW_GROUP_SIZE_BYTES and meta.compression_codec == "uncompressed"
                    and meta.dtype == "float32" and meta.parent_cache_dir_url == parent_url
                    and meta.df_plan.sameResult(plan)):
                return meta.cache_dir_url
    return None


def _cache_files(spark, url: str) -> List[str]:
    """The Parquet files of a cache directory, listed through Spark's Hadoop filesystem (any scheme Spark
    wrote it with), as ``scheme://path`` URLs; no Spark job."""
    files = []
    for file_url in jvm.list_files(spark.sparkContext, url):
        name = file_url.rsplit("/", 1)[-1]
        if name.endswith(".parquet") and not name.startswith(("_", ".")):
            files.append("file://" + file_url[len("file:"):] if file_url.startswith("file:/") and
                         not file_url.startswith("file://") else file_url)
    return files


def _materialise(spark, df, plan, kinds: Dict[str, str], parent_url: str, ranges: Iterable[str] = ()):
    """Write ``df`` as a Petastorm cache and measure its values in the same job (``DataFrame.observe``).

    Returns ``(converter, owned, stats)``: ``owned`` is False when the user's own Petastorm converter had
    already made this cache (then nothing is written and ``stats`` is ``None``: the caller aggregates).
    Writes the way ``make_spark_converter`` does (row groups, no compression, doubles as float32), but skips
    its second job, a full ``count()`` of what was just written: the write counted its rows itself.
    """
    from petastorm.spark import spark_dataset_converter as psc
    from pyspark.sql import Observation

    existing = _users_petastorm_cache(plan, parent_url)
    if existing is not None:
        files = _cache_files(spark, existing)
        return psc.SparkDatasetConverter(existing, files, _row_count(files)), False, None
    df = _with_arrays(df, kinds)
    observation = Observation(f"spark_dist_checks_{uuid.uuid4().hex}")
    observed = _as_float32(df.observe(observation, *_value_exprs(df.schema, kinds, ranges)))
    quiet = _QuietPetastorm()
    psc.logger.addFilter(quiet)
    try:
        url = psc._materialize_df(observed, parent_url, psc.DEFAULT_ROW_GROUP_SIZE_BYTES, "uncompressed",
                                  "float32")
    finally:
        psc.logger.removeFilter(quiet)
    files = _cache_files(spark, url)
    stats = _observed(observation)
    # The write counted its rows; the footers (read once more by describe_files) only when it did not say.
    rows = stats["rows"] if stats is not None else _row_count(files)
    converter = psc.SparkDatasetConverter(url, files, rows)
    logger.info("spark_dist: materialised %d rows in %d files at %s", len(converter), len(files), url)
    return converter, True, stats


def _row_count(file_urls) -> int:
    return sum(open_parquet(url).metadata.num_rows for url in file_urls)


def _observed(observation, timeout: float = 30.0) -> Optional[Dict[str, Any]]:
    """The observed metrics, or ``None`` if they do not come (they travel by Spark's listener bus after the
    write returns; ``Observation.get`` alone would wait forever were an event ever dropped)."""
    got: Dict[str, Any] = {}
    reader = threading.Thread(target=lambda: got.update(observation.get), daemon=True,
                              name="spark_dist-observation")
    reader.start()
    reader.join(timeout)
    if reader.is_alive() or not got:
        logger.warning("spark_dist: the dataset checks measured during the write did not arrive within %.0f s; "
                       "measuring them again over the cache", timeout)
        return None
    return got


class _QuietPetastorm(logging.Filter):
    """Petastorm warns on every call that it converts doubles to float32 (documented here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Converting floating-point")


def _aggregate_cache(spark, cache_dir_url: str, df_schema, kinds: Dict[str, str],
                     ranges: Iterable[str] = ()) -> Dict[str, Any]:
    """The same measures as the write observes, over a cache made before (one aggregation job)."""
    return spark.read.parquet(cache_dir_url).agg(*_value_exprs(df_schema, kinds, ranges)).first().asDict()


def _enough_rows(name: str, rows: int, num_ranks: int) -> None:
    if rows == 0:
        raise DatasetError(f"dataset {name!r}: the DataFrame is empty; check the filter or source that made it",
                           name)
    if rows < num_ranks:
        raise DatasetError(f"dataset {name!r} has {rows} rows, fewer than the {num_ranks} ranks: every rank "
                           "needs at least one row; use fewer processes or more data", name)


def _judge(name: str, stats: Dict[str, Any], rows: int, kinds: Dict[str, str],
           num_ranks: int) -> Dict[str, ColumnStats]:
    """Turn the measures into errors (naming the dataset and column) or into each column's stats.

    Raises:
        DatasetError: no rows, fewer rows than ranks, nulls, null elements, or arrays of unequal or no length.
    """
    _enough_rows(name, rows, num_ranks)
    described: Dict[str, ColumnStats] = {}
    for i, (column, kind) in enumerate(kinds.items()):
        where = f"dataset {name!r}: column {column!r}"
        if stats.get(f"null{i}"):
            raise DatasetError(f"{where} has {stats[f'null{i}']} null values; drop or fill them first, "
                               f"e.g. df.na.drop(subset=[{column!r}])", name, column)
        if kind == SCALAR:
            if f"lo{i}" in stats:
                described[column] = ColumnStats(minimum=stats[f"lo{i}"], maximum=stats[f"hi{i}"],
                                                non_integers=int(stats.get(f"frac{i}") or 0),
                                                nans=int(stats.get(f"nan{i}") or 0))
            continue
        if stats.get(f"inner{i}"):
            raise DatasetError(f"{where} has {stats[f'inner{i}']} arrays holding null elements; "
                               "fill them first (e.g. F.transform(col, lambda x: F.coalesce(x, F.lit(0.0))))",
                               name, column)
        lo, hi = stats[f"min{i}"], stats[f"max{i}"]
        if lo != hi:
            raise DatasetError(f"{where} holds {kind}s of unequal length (from {lo} to {hi}); a batch needs one "
                               "length per column: pad or truncate them first (e.g. F.slice)", name, column)
        if lo == 0:
            raise DatasetError(f"{where} holds only empty {kind}s", name, column)
        described[column] = ColumnStats(length=int(lo))
    return described


def _delete(entry: _Entry) -> None:
    if not entry.owned:
        return
    try:
        entry.converter.delete()  # also drops it from Petastorm's own list, so Petastorm will not reuse it
    except Exception as exc:  # noqa: BLE001 -- cleanup is best effort; say what is left behind
        logger.warning("spark_dist: could not delete the dataset cache %s: %r", entry.converter.cache_dir_url, exc)


# -- the public functions ------------------------------------------------------------------------------------
def prepare_datasets(spark, datasets: Dict[str, Any], num_ranks: int,
                     value_ranges: Iterable[str] = ()) -> Dict[str, DatasetHandle]:
    """Materialise each DataFrame once as a Petastorm cache and describe it for the ranks.

    All schemas are checked before any Spark job. Each new DataFrame then costs one Spark job: the write,
    which also measures the values it checks (``DataFrame.observe``), so a bad value is refused before any
    training job. A DataFrame passed again (the same plan, as Spark's ``sameResult`` judges) reuses its cache
    without a job, and a :class:`DatasetHandle` this function returned passes through as it is. Vector
    columns are stored as float32 arrays and doubles as float32; each handle's column stats hold the lengths,
    and the value ranges of the number columns named in ``value_ranges``, measured before that narrowing.
    The same DataFrame prepared by two threads at once is written once. The caches are deleted by
    :func:`clear_cache`, when the SparkContext stops, or when this process exits.

    The cache goes under ``petastorm.spark.converter.parentCacheDirUrl`` when set, else under a new
    directory in ``spark.local.dir`` or the temp dir (``file://``). A ``file://`` cache works wherever all
    executors run on the driver's machine (``local[N]``, ``local-cluster``, a one-machine standalone
    cluster); with executors on other hosts it is refused, because they could not see each other's files.

    Raises:
        DatasetError: a handle whose cache was deleted, a column of an unsupported type (string, struct,
            map, decimal, ...), an empty DataFrame, fewer rows than ``num_ranks``, nulls in a column, arrays
            or vectors of unequal length or empty, a cache dir URL without a scheme, or a ``file://`` cache
            while executors run on other hosts. Each message names the dataset and the column or conf key.
        TypeError: ``datasets`` is not a dict of name -> DataFrame (or DatasetHandle).
        ValueError: ``num_ranks`` < 1.
    """
    from pyspark.sql import DataFrame

    if not isinstance(datasets, dict):
        raise TypeError(f"datasets= must be a dict of name -> DataFrame, got {type(datasets).__name__}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks}: need at least 1")
    kinds = {}
    for name, df in datasets.items():
        if isinstance(df, DatasetHandle):
            continue
        if not isinstance(df, DataFrame):
            raise TypeError(f"datasets[{name!r}] must be a pyspark.sql.DataFrame, got {type(df).__name__}")
        kinds[name] = column_kinds(name, df)
    parent_url = _parent_url(spark)
    _check_reachable(spark, parent_url)
    _register_cleanup(spark.sparkContext)
    app_id = spark.sparkContext.applicationId
    handles = {}
    for name, df in datasets.items():
        if isinstance(df, DatasetHandle):
            handles[name] = pass_through(name, df, num_ranks)
        else:
            handles[name] = _prepare_one(spark, name, df, kinds[name], num_ranks, parent_url, app_id,
                                         tuple(value_ranges))
    _evict(app_id, keep={h.cache_dir_url for h in handles.values()})
    return handles


def pass_through(name: str, handle: DatasetHandle, num_ranks: int) -> DatasetHandle:
    """A handle ``prepare_datasets`` returned before, renamed ``name``, once it is known to be still there.

    Raises:
        DatasetError: its cache was deleted (by ``clear_cache``, eviction or a stopped SparkContext), or it
            has fewer rows than ``num_ranks``.
    """
    directory = local_path(handle.cache_dir_url)
    if directory is not None and not os.path.isdir(directory):
        raise DatasetError(f"dataset {name!r}: its cache {handle.cache_dir_url} was deleted (clear_cache(), "
                           "more than MAX_CACHED_DATASETS caches, or its SparkContext stopped); pass the "
                           "DataFrame again", name)
    _enough_rows(name, handle.num_rows, num_ranks)
    return replace(handle, name=name)


def _prepare_one(spark, name: str, df, kinds: Dict[str, str], num_ranks: int, parent_url: str, app_id: str,
                 ranges: Tuple[str, ...]) -> DatasetHandle:
    plan = jvm.analyzed_plan(df)
    inputs = _input_files(spark, df)
    while True:
        with _lock:
            hit = next((e for e in _entries if _same_data(e, app_id, parent_url, plan, inputs)), None)
            if hit is not None:
                _entries.remove(hit)  # most recently used last
                _entries.append(hit)
                break
            # The same plan being written by another thread right now (CrossValidator's parallel fits of one
            # fold): wait for that write and use it rather than writing the same data twice.
            writing = next((w for w in _writing if _same_data(w, app_id, parent_url, plan, inputs)), None)
            if writing is None:
                mine = _Write(app_id, parent_url, plan, inputs, threading.Event())
                _writing.append(mine)
                break
        writing.done.wait()
    if hit is not None:
        _enough_rows(name, hit.handle.num_rows, num_ranks)
        missing = [c for c in ranges if c in kinds and kinds[c] == SCALAR
                   and hit.handle.column(c).stats.minimum is None and not hit.handle.column(c).stats.nans]
        if missing:  # written by a caller that did not ask for these ranges: one aggregation over the cache
            stats = _aggregate_cache(spark, hit.handle.cache_dir_url, df.schema, kinds, ranges)
            described = _judge(name, stats, hit.handle.num_rows, kinds, num_ranks)
            hit.handle = replace(hit.handle, columns=tuple(
                replace(c, stats=described.get(c.name, c.stats)) for c in hit.handle.columns))
        return replace(hit.handle, name=name)
    try:
        converter, owned, stats = _materialise(spark, df, plan, kinds, parent_url, ranges)
        entry = _Entry(app_id, parent_url, plan, inputs, converter, None, owned)  # type: ignore[arg-type]
        try:
            if stats is None:
                stats = _aggregate_cache(spark, converter.cache_dir_url, df.schema, kinds, ranges)
            described = _judge(name, stats, len(converter), kinds, num_ranks)
            entry.handle = describe_files(name, converter.cache_dir_url, converter.file_urls, kinds, described)
        except BaseException:
            _delete(entry)
            raise
        with _lock:
            _entries.append(entry)
        return entry.handle
    finally:
        with _lock:
            _writing.remove(mine)
        mine.done.set()


@contextmanager
def in_use(handles: Iterable[DatasetHandle]):
    """Keep these handles' caches from eviction while a run reads them (another thread's prepare_datasets
    may go past MAX_CACHED_DATASETS meanwhile)."""
    urls = [h.cache_dir_url for h in handles]
    with _lock:
        for url in urls:
            _in_use[url] = _in_use.get(url, 0) + 1
    try:
        yield
    finally:
        with _lock:
            for url in urls:
                _in_use[url] -= 1
                if not _in_use[url]:
                    del _in_use[url]


def _evict(app_id: str, keep) -> None:
    """Delete the least recently used caches of ``app_id`` beyond :data:`MAX_CACHED_DATASETS`."""
    with _lock:
        mine = [e for e in _entries if e.app_id == app_id]
        extra = len(mine) - MAX_CACHED_DATASETS
        gone = [e for e in mine if e.handle.cache_dir_url not in keep
                and e.handle.cache_dir_url not in _in_use][:max(extra, 0)]
        _entries[:] = [e for e in _entries if e not in gone]
    for entry in gone:
        _delete(entry)


def clear_cache(spark=None) -> int:
    """Delete the dataset caches this process made (all of them, or only ``spark``'s application's).

    Caches the user made (their own conf's parent dir, a Petastorm cache made before) are never touched.
    Also runs when the SparkContext stops and when the interpreter exits. Returns how many were deleted;
    never raises for a cache that cannot be deleted (it logs a warning naming it).
    """
    global _default_parent
    app_id = spark.sparkContext.applicationId if spark is not None else None
    if os.getpid() != _owner_pid:
        return 0
    with _lock:
        gone = [e for e in _entries if app_id is None or e.app_id == app_id]
        _entries[:] = [e for e in _entries if e not in gone]
        left = bool(_entries)
    for entry in gone:
        _delete(entry)
    with _lock:
        if not left and _default_parent is not None:
            shutil.rmtree(_default_parent, ignore_errors=True)  # made by mkdtemp in this process: ours
            _default_parent = None
    return sum(e.owned for e in gone)


def _stop_after_clearing(original_stop, app_id: str) -> None:
    try:
        with _lock:
            gone = [e for e in _entries if e.app_id == app_id]
            _entries[:] = [e for e in _entries if e.app_id != app_id]
        for entry in gone:
            _delete(entry)
    finally:
        original_stop()


def _register_cleanup(sc) -> None:
    """Delete the caches when the SparkContext stops and at interpreter exit, so they never pile up.

    PySpark has no stop hook, so the context's ``stop`` is wrapped (once) on this instance only.
    """
    global _atexit_registered
    with _lock:
        if not _atexit_registered:
            atexit.register(clear_cache)
            _atexit_registered = True
        if not getattr(sc, "_spark_dist_clears_cache", False):
            sc.stop = functools.partial(_stop_after_clearing, sc.stop, sc.applicationId)
            sc._spark_dist_clears_cache = True


__all__ = ["CACHE_DIR_CONF", "prepare_datasets", "clear_cache", "column_kinds", "remote_hosts", "in_use",
           "pass_through"]
