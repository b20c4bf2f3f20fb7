"""The driver's room, its one path: a run's ``datasets=`` values in, the ranks' handles out.

:func:`prepare_datasets` is the entry: ``Distributor.run``, ``TorchEstimator.fit``, ``tune.optimize`` and users
call it. Its docstring lists the steps; each is one module of this room, in the order data flows, called from
here and handing back plain data for the next: an :class:`_Input` (a Petastorm input's
:class:`~.petastorm_inputs.Source`), the registry's :class:`~.registry.Claim`, the write's converter and
measures, the checked kinds and stats, the contract's :class:`~spark_dist.data.handle.DatasetHandle`.
"""
import os
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, Optional, Tuple

from ...errors import ConfigError
from ...spark import session
from ..handle import DatasetError, DatasetHandle, describe_files
from ..schema import ARRAY, SCALAR, SEQUENCE, column_kinds
from ..urls import local_path
from . import location, petastorm_inputs, registry
from .checks import _aggregate, _enough_rows, _kinds_and_stats, unequal_lengths
from .write import _materialise


@dataclass(frozen=True)
class _Input:
    """A DataFrame or a Petastorm input, as step 1 found it: ``df`` (the user's DataFrame, or one reading the
    Petastorm input's files: what the registry keys it by and the checks measure), ``kinds`` (column -> kind,
    from the schema alone), ``source`` (a Petastorm input: its own files, read as they are, never written)."""

    df: Any
    kinds: Dict[str, str]
    source: Optional[petastorm_inputs.Source] = None


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

    The path, a straight line through this room: each step is one module, in this order (step 4 is a claim in
    the registry's call that step 2 opened):

    1. What each value is, before any job (:func:`_inputs`): a handle passes through (step 2 holds it, then it is
       checked: still there, enough rows); a Petastorm converter or dataset URL is described by
       :mod:`.petastorm_inputs` (its Unischema and codecs, its files and their schema); a DataFrame's column
       kinds come from its schema (:func:`spark_dist.data.schema.column_kinds`).
    2. The call (:func:`.registry.preparing`): until it returns, what it hands out is neither evicted nor cleared;
       the caches are deleted when the SparkContext stops or this process exits; once it has succeeded, the
       least recently used beyond ``MAX_CACHED_DATASETS`` are evicted.
    3. Where the caches go (:func:`.location.checked_parent`), where a DataFrame may be written: the parent
       directory, which every executor must reach.

    Then, for each DataFrame or Petastorm input (:func:`_cached`):

    4. The call's claim on its cache (:meth:`.registry.Call.claim`): the cache of the same data found again
       (then only what this caller asks beyond the first is checked: :func:`_completed`), or this thread's to
       make, another thread preparing the same data waiting for it.
    5. The write (:mod:`.write`): one Spark job, which also measures the values; a Petastorm input is read as it
       is, nothing written.
    6. The checks (:mod:`.checks`): the measures (one aggregation where the write did not observe them) become
       the column kinds and stats, or a :class:`DatasetError` naming the dataset and column (a cache written
       and refused is deleted).
    7. The handle (:func:`spark_dist.data.handle.describe_files`, the contract): from the files' footers, a
       Petastorm input's codec columns included; the claim keeps it for later calls.

    ``spark`` may be ``None`` (a local-mode run) where every value is a handle: step 1 alone.

    Raises:
        DatasetError: a handle whose cache was deleted, a column of an unsupported type (struct, map, decimal,
            date, arrays of strings, ...; the message says what to do instead), an empty DataFrame, fewer rows
            than ``num_ranks``, nulls in a column (or null elements in an array), vectors (or arrays named in
            ``fixed_length``) of unequal length, nested arrays of unequal shape, arrays that are empty in every
            row, a cache dir URL without a scheme, or a ``file://`` cache while executors run on other hosts.
            Each message names the dataset and the column or conf key, and says how to fill or drop nulls. For a
            Petastorm input, before any job: a converter whose cache was deleted, a URL with no Petastorm
            metadata, a codec spark_dist does not know, a partitioned dataset (see :func:`.petastorm_inputs.source`).
        ConfigError: ``spark`` is ``None`` and a value is no handle.
        TypeError: ``datasets`` is not a dict of name -> DataFrame (or DatasetHandle, Petastorm converter or
            Petastorm dataset URL).
        ValueError: ``num_ranks`` < 1.
    """
    if spark is None:  # a local-mode run: handles need no Spark
        if not isinstance(datasets, dict) or not all(isinstance(d, DatasetHandle) for d in datasets.values()):
            raise ConfigError("datasets= holding DataFrames needs an active SparkSession")
        return {name: pass_through(name, handle, num_ranks) for name, handle in datasets.items()}
    inputs = _inputs(spark, datasets, num_ranks)  # step 1
    ranges, fixed = tuple(value_ranges), tuple(fixed_length)
    with registry.preparing(spark) as call:  # step 2
        writes = any(isinstance(i, _Input) and i.source is None for i in inputs.values())
        parent_url = location.checked_parent(spark) if writes else ""  # step 3
        handles = {}
        for name, value in inputs.items():
            if isinstance(value, DatasetHandle):
                call.hold(value.cache_dir_url)  # before the check: no clear_cache in between
                handles[name] = pass_through(name, value, num_ranks)
            else:  # steps 4 to 7
                handles[name] = _cached(spark, call, name, value, num_ranks, parent_url, ranges, fixed)
    return handles


def _inputs(spark, datasets: Dict[str, Any], num_ranks: int) -> Dict[str, Any]:
    """Step 1: each value as a :class:`DatasetHandle` (passed through) or an :class:`_Input`; no Spark job.

    Raises:
        TypeError, ValueError, DatasetError: as :func:`prepare_datasets` says, before any job.
    """
    from pyspark.sql import DataFrame

    if not isinstance(datasets, dict):
        raise TypeError(f"datasets= must be a dict of name -> DataFrame, got {type(datasets).__name__}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks}: need at least 1")
    found: Dict[str, Any] = {}
    for name, value in datasets.items():
        if isinstance(value, DatasetHandle):
            found[name] = value
        elif petastorm_inputs.accepts(value):
            source = petastorm_inputs.source(spark, name, value)  # checked before any job: nothing is written
            found[name] = _Input(source.df, source.kinds, source)
        elif isinstance(value, DataFrame):
            found[name] = _Input(value, column_kinds(name, value))
        else:
            raise TypeError(f"datasets[{name!r}] must be a pyspark.sql.DataFrame (or a DatasetHandle, a Petastorm "
                            f"SparkDatasetConverter or a Petastorm dataset's URL), got {type(value).__name__}")
    return found


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


def _cached(spark, call: registry.Call, name: str, item: _Input, num_ranks: int, parent_url: str,
            ranges: Tuple[str, ...], fixed_length: Tuple[str, ...]) -> DatasetHandle:
    """Steps 4-7 for one DataFrame or Petastorm input: its cache found again, or written (a Petastorm input: its
    own files), checked and described; held until the call returns."""
    source = item.source
    with call.claim(parent_url if source is None else source.key, item.df) as claim:  # step 4
        if claim.found is not None:
            completed = _completed(spark, name, item, claim.found, num_ranks, ranges, fixed_length)
            return replace(claim.keep(completed), name=name)
        if source is None:  # step 5
            converter, owned, stats = _materialise(spark, item.df, item.kinds, parent_url, ranges)
            url, files = converter.cache_dir_url, converter.file_urls
        else:  # the user's files: read as they are, never deleted (owned=False)
            converter, owned, stats = source.converter, False, None
            url, files = source.url, source.file_urls
        claim.made(converter, owned)
        if stats is None:  # step 6; a cache the user's converter made, or a Petastorm input: one aggregation
            frame = source.df if source is not None else spark.read.parquet(url)
            stats = _aggregate(frame, item.df.schema, item.kinds, ranges)
        rows = len(converter) if source is None else int(stats["rows"])
        kinds, described = _kinds_and_stats(name, stats, rows, item.kinds, num_ranks, fixed_length)
        return claim.keep(_described(spark, name, url, files, kinds, described, source))  # step 7


def _completed(spark, name: str, item: _Input, found: DatasetHandle, num_ranks: int, ranges: Tuple[str, ...],
               fixed_length: Tuple[str, ...]) -> DatasetHandle:
    """A cache found again, checked for this caller: enough rows, one length where ``fixed_length`` needs it
    (it was written for a caller that took arrays of any length), and the value ranges this caller asks for
    that the first did not measure (one aggregation over the files).

    Raises:
        DatasetError: as :func:`prepare_datasets` says.
    """
    _enough_rows(name, found.num_rows, num_ranks)
    for c in fixed_length:
        info = found.column(c) if c in item.kinds else None
        if info is not None and info.kind == SEQUENCE:
            raise unequal_lengths(name, c, ARRAY, *info.stats.length_range)
    missing = [c for c in ranges if c in item.kinds and item.kinds[c] == SCALAR
               and found.column(c).stats.minimum is None and not found.column(c).stats.nans]
    if not missing:
        return found
    frame = item.source.df if item.source is not None else spark.read.parquet(found.cache_dir_url)
    stats = _aggregate(frame, item.df.schema, item.kinds, ranges)
    _, described = _kinds_and_stats(name, stats, found.num_rows, item.kinds, num_ranks)
    return replace(found, columns=tuple(replace(c, stats=described.get(c.name, c.stats)) for c in found.columns))


def _described(spark, name: str, url: str, file_urls, kinds: Dict[str, str], described,
               source: Optional[petastorm_inputs.Source]) -> DatasetHandle:
    """Step 7: the handle, from the files' footers (a Petastorm input's codec columns as the ranks decode them).
    Under Spark Connect, where this client does not see the files (the driver runs elsewhere), one task reads
    them: executors see the cache by definition."""
    codecs = source.codecs if source is not None else None
    directory = local_path(url)
    if session.is_connect(spark) and (directory is None or not os.path.isdir(directory)):
        files = list(file_urls)
        return session.run_on_executors(
            spark, 1, lambda _: [describe_files(name, url, files, kinds, described, codecs)])[0]
    return describe_files(name, url, file_urls, kinds, described, codecs)


__all__ = ["prepare_datasets", "pass_through"]
