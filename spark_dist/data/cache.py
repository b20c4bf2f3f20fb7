"""The driver side: check each DataFrame, materialise it once as a Petastorm-format cache, clean up after.

:func:`prepare_datasets` runs the steps, in the order data flows: the schema (:mod:`.schema`, no Spark job),
where the cache goes and whether executors reach it (:mod:`.location`), the cache already made of the same
data (:mod:`.registry`), else the write (:mod:`.write`) with the value checks measured on the way
(:mod:`.checks`). The public names of those modules are importable from here too. What Petastorm users already
have (their converter, a Petastorm dataset's URL) is described the same way, but read as it is
(:mod:`.petastorm_inputs`).
"""
import contextlib
import os
from dataclasses import replace
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..errors import ConfigError
from ..spark import session
from . import petastorm_inputs
from .checks import _aggregate_cache, _enough_rows, _kinds_and_stats, unequal_lengths
from .handle import DatasetError, DatasetHandle, describe_files, local_path
from .location import CACHE_DIR_CONF, _check_reachable, _parent_url, remote_hosts
from .registry import (_Entry, _add, _app_id, _delete, _done_writing, _evict, _find_or_claim, _hold, _input_files,
                       _register_cleanup, clear_cache, in_use, preparing)
from .schema import ARRAY, SCALAR, SEQUENCE, column_kinds
from .write import _materialise


def prepare_datasets(spark, datasets: Dict[str, Any], num_ranks: int, value_ranges: Iterable[str] = (),
                     fixed_length: Iterable[str] = ()) -> Dict[str, DatasetHandle]:
    """Materialise each DataFrame once as a Petastorm-format cache (a plain DataFrame write, so it also runs
    under Spark Connect) and describe it for the ranks.

    All schemas are checked before any Spark job. Each new DataFrame then costs one Spark job: the write,
    which also measures the values it checks (``DataFrame.observe``), so a bad value is refused before any
    training job. A DataFrame passed again (the same plan, as Spark's ``sameSemantics`` judges) reuses its
    cache without a job, and a :class:`DatasetHandle` this function returned passes through as it is. Vector
    columns are stored as float32 arrays and doubles as float32; each handle's column stats hold the lengths,
    and the value ranges of the number columns named in ``value_ranges``, measured before that narrowing.

    Column kinds (see :func:`spark_dist.data.make_loader` for what a batch holds of each): numbers; arrays of
    numbers, a ``"sequence"`` when their rows differ in length (unless named in ``fixed_length``, where one
    length is needed, e.g. a model's input) and an ``"array"`` otherwise; ML vectors; nested arrays of numbers
    (``array<array<float>>``; every row the same shape, checked by the write); binary; string.
    The same DataFrame prepared by two threads at once is written once. The caches are deleted by
    :func:`clear_cache` (which leaves alone the caches a call under way is writing or has handed out), when
    the SparkContext stops, or when this process exits.

    The cache goes under ``petastorm.spark.converter.parentCacheDirUrl`` when set, else under a new
    directory in ``spark.local.dir`` or the temp dir (``file://``). A ``file://`` cache works wherever all
    executors run on the driver's machine (``local[N]``, ``local-cluster``, a one-machine standalone
    cluster); with executors on other hosts it is refused, because they could not see each other's files.

    What Petastorm users already have is taken as it is, nothing written (:mod:`.petastorm_inputs`): a
    ``petastorm.spark.SparkDatasetConverter`` (its cache files, never deleted here: they are the user's), and a
    Petastorm dataset's URL (a ``str``, written by ``materialize_dataset`` with a Unischema), whose codec columns
    (images, ndarrays) the ranks decode. Each is described with one aggregation job (the value checks), and once
    per application, as a DataFrame's cache is.

    Raises:
        DatasetError: a handle whose cache was deleted, a column of an unsupported type (struct, map, decimal,
            date, arrays of strings, ...; the message says what to do instead), an empty DataFrame, fewer rows
            than ``num_ranks``, nulls in a column (or null elements in an array), vectors (or arrays named in
            ``fixed_length``) of unequal length, nested arrays of unequal shape, arrays that are empty in every
            row, a cache dir URL without a scheme, or a ``file://`` cache while executors run on other hosts.
            Each message names the dataset and the column or conf key, and says how to fill or drop nulls. For a
            Petastorm input, before any job: a converter whose cache was deleted, a URL with no Petastorm
            metadata, a codec spark_dist does not know, a partitioned dataset (see :func:`.petastorm_inputs.source`).
        TypeError: ``datasets`` is not a dict of name -> DataFrame (or DatasetHandle, Petastorm converter or
            Petastorm dataset URL).
        ValueError: ``num_ranks`` < 1.
    """
    from pyspark.sql import DataFrame

    if not isinstance(datasets, dict):
        raise TypeError(f"datasets= must be a dict of name -> DataFrame, got {type(datasets).__name__}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks}: need at least 1")
    kinds, sources = {}, {}
    for name, df in datasets.items():
        if isinstance(df, DatasetHandle):
            continue
        if petastorm_inputs.accepts(df):
            sources[name] = petastorm_inputs.source(spark, name, df)  # checked before any job: nothing is written
            kinds[name] = sources[name].kinds
            continue
        if not isinstance(df, DataFrame):
            raise TypeError(f"datasets[{name!r}] must be a pyspark.sql.DataFrame (or a DatasetHandle, a Petastorm "
                            f"SparkDatasetConverter or a Petastorm dataset's URL), got {type(df).__name__}")
        kinds[name] = column_kinds(name, df)
    with preparing() as held:  # before the parent dir is chosen: clear_cache must not remove it meanwhile
        writes = any(name not in sources for name in kinds)  # a DataFrame: its cache may be written
        parent_url = _parent_url(spark) if writes else ""
        if writes:
            _check_reachable(spark, parent_url)
        _register_cleanup(spark)
        app_id = _app_id(spark)
        handles = {}
        for name, df in datasets.items():
            if isinstance(df, DatasetHandle):
                _hold(held, df.cache_dir_url)
                handles[name] = pass_through(name, df, num_ranks)
            else:
                handles[name] = _prepare_one(spark, name, df, kinds[name], num_ranks, parent_url, app_id,
                                             tuple(value_ranges), held, tuple(fixed_length), sources.get(name))
        _evict(app_id, keep={h.cache_dir_url for h in handles.values()})
    return handles


def handles_for_run(spark, datasets: Dict[str, Any], num_ranks: int) -> Dict[str, Any]:
    """Dataset handles for a run's ranks: DataFrames are materialised (which needs Spark); handles that
    :func:`prepare_datasets` returned before pass through, so a local-mode run needs no SparkSession for them.

    Raises:
        ConfigError: DataFrames without a SparkSession; DatasetError: as :func:`prepare_datasets`.
    """
    if spark is None:
        if not isinstance(datasets, dict) or not all(isinstance(d, DatasetHandle) for d in datasets.values()):
            raise ConfigError("datasets= holding DataFrames needs an active SparkSession")
        return {name: pass_through(name, handle, num_ranks) for name, handle in datasets.items()}
    return prepare_datasets(spark, datasets, num_ranks)


def not_evicted(handles: Dict[str, Any]):
    """A context in which the handles' caches are not evicted (while ranks read them); nothing without any."""
    return in_use(handles.values()) if handles else contextlib.nullcontext()


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
                 ranges: Tuple[str, ...], held: List[str], fixed_length: Tuple[str, ...] = (),
                 source: Optional[petastorm_inputs.Source] = None) -> DatasetHandle:
    """``df``'s cache, found or written, and held (in use) until the ``prepare_datasets`` call returns; for a
    Petastorm ``source``, its files described (once per application, as a cache is found again), never written."""
    if source is not None:  # its own slot in the registry: a DataFrame's lookup never finds it, nor the reverse
        df, parent_url = source.df, source.key
    inputs = _input_files(spark, df)
    hit, mine = _find_or_claim(app_id, parent_url, df, inputs, held)
    if hit is not None:
        _enough_rows(name, hit.handle.num_rows, num_ranks)
        for c in fixed_length:  # written for a caller that took arrays of any length
            info = hit.handle.column(c) if c in kinds else None
            if info is not None and info.kind == SEQUENCE:
                raise unequal_lengths(name, c, ARRAY, *info.stats.length_range)
        missing = [c for c in ranges if c in kinds and kinds[c] == SCALAR
                   and hit.handle.column(c).stats.minimum is None and not hit.handle.column(c).stats.nans]
        if missing:  # written by a caller that did not ask for these ranges: one aggregation over the cache
            stats = (source.measure(kinds, ranges) if source is not None
                     else _aggregate_cache(spark, hit.handle.cache_dir_url, df.schema, kinds, ranges))
            _, described = _kinds_and_stats(name, stats, hit.handle.num_rows, kinds, num_ranks)
            hit.handle = replace(hit.handle, columns=tuple(
                replace(c, stats=described.get(c.name, c.stats)) for c in hit.handle.columns))
        return replace(hit.handle, name=name)
    try:
        if source is None:
            converter, owned, stats = _materialise(spark, df, kinds, parent_url, ranges)
        else:  # the user's files: read as they are, never deleted (owned=False)
            converter, owned, stats = source.converter, False, source.measure(kinds, ranges)
        entry = _Entry(app_id, parent_url, df, inputs, converter, None, owned)  # type: ignore[arg-type]
        try:
            if stats is None:
                stats = _aggregate_cache(spark, converter.cache_dir_url, df.schema, kinds, ranges)
            if source is None:
                url, files, rows = converter.cache_dir_url, converter.file_urls, len(converter)
            else:
                url, files, rows = source.url, source.file_urls, int(stats["rows"])
            settled, described = _kinds_and_stats(name, stats, rows, kinds, num_ranks, fixed_length)
            entry.handle = _described(spark, name, url, files, settled, described)
            if source is not None:
                entry.handle = source.decorated(entry.handle)
        except BaseException:
            _delete(entry)
            raise
        _add(entry, held)
        return entry.handle
    finally:
        _done_writing(mine)


def _described(spark, name: str, cache_dir_url: str, file_urls, kinds: Dict[str, str], described) -> DatasetHandle:
    """The handle, from the cache files' footers; under Spark Connect, when this client does not see the
    cache (the driver runs elsewhere), one task reads them: executors see the cache by definition."""
    directory = local_path(cache_dir_url)
    if session.is_connect(spark) and (directory is None or not os.path.isdir(directory)):
        files = list(file_urls)
        return session.run_on_executors(
            spark, 1, lambda _: [describe_files(name, cache_dir_url, files, kinds, described)])[0]
    return describe_files(name, cache_dir_url, file_urls, kinds, described)


__all__ = ["CACHE_DIR_CONF", "prepare_datasets", "clear_cache", "column_kinds", "remote_hosts", "in_use",
           "pass_through"]
