"""The write: one DataFrame materialised as a Petastorm cache, its values measured in the same Spark job.

Writes the way Petastorm's ``make_spark_converter`` does (row groups, no compression, doubles as float32),
with vectors as dense float32 arrays, and reuses a cache the user's own converter already made of the same
DataFrame.
"""
import contextlib
import importlib
import logging
import sys
import threading
import time
import uuid
import warnings
from typing import Dict, Iterable, List, Optional

from ...spark import jvm, session
from ..schema import BINARY, NESTED, STRING, VECTOR, by_position, leaf_type, nesting, position, sql
from ..urls import open_parquet
from .checks import _observed, _value_exprs
from .location import delete_dir

# Petastorm 0.12 uses pyarrow APIs that pyarrow 14 marks deprecated; the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm\.")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"petastorm\.")

logger = logging.getLogger(__name__)

_CONVERTER_MODULE = "petastorm.spark.spark_dataset_converter"
# Petastorm's converter writes 32 MiB row groups; a quarter of that bounds what a rank holds decoded (it decodes
# whole row groups, a few ahead of the one it shuffles from: loader._DECODE_AHEAD), gives the epoch order finer
# pieces to permute, and wastes less where two ranks share a row group. Petastorm's own readers read either.
ROW_GROUP_BYTES = 8 << 20
# Parquet's writer first compares a row group's size with ROW_GROUP_BYTES after this many rows (its default: 100),
# then about halfway to the size it expects. Rows of images or long texts can make a row group of 100 rows many
# times ROW_GROUP_BYTES, and a rank decodes whole row groups, a few ahead: so for the kinds whose rows can be
# large, the first comparison comes after the first row. Number columns keep the writer's default.
_LARGE_ROW_KINDS = (BINARY, STRING, NESTED)
_FIRST_SIZE_CHECK_ROWS = 1


def _with_arrays(df, kinds: Dict[str, str]):
    """Vectors as dense float32 arrays, as the cache stores them: sparse vectors would not reshape per batch.
    ``df``'s columns are named by position (:func:`.schema.by_position`), and ``kinds`` are theirs, in order; so
    are the result's."""
    from pyspark.ml.functions import vector_to_array

    if VECTOR not in kinds.values():
        return df
    named = [position(i) for i in range(len(kinds))]
    return df.select([vector_to_array(sql(c), "float32") if kind == VECTOR else c
                      for c, kind in zip(named, kinds.values())]).toDF(*named)


def _as_float32(df):
    """Doubles (and arrays of doubles) as float32, as Petastorm's converter stores them (here rather than by
    Petastorm's own pass, which reads ``df[name]`` and so takes a dot in a name for a struct field). ``df``'s
    columns are named by position (:func:`.schema.by_position`); so are the result's."""
    from pyspark.sql import types as T

    def narrowed_type(field):  # the type to cast to, or None where the field stays as it is
        if isinstance(field.dataType, T.DoubleType):
            return "FLOAT"
        depth = nesting(field.dataType)
        if depth and isinstance(leaf_type(field.dataType), T.DoubleType):  # arrays of doubles, nested or not
            return "ARRAY<" * depth + "FLOAT" + ">" * depth
        return None
    casts = [narrowed_type(f) for f in df.schema.fields]
    if not any(casts):
        return df
    return df.selectExpr(*[f"CAST({position(i)} AS {t}) AS {position(i)}" if t else position(i)
                           for i, t in enumerate(casts)])


def _users_petastorm_cache(spark, df, parent_url: str) -> Optional[str]:
    """The cache a ``make_spark_converter`` call of the user's already made of this very DataFrame (by its
    analyzed plan; with the settings we use), which we read but never delete. Never under Spark Connect,
    where Petastorm's converter cannot run."""
    if session.is_connect(spark) or sys.modules.get(_CONVERTER_MODULE) is None:
        return None  # no converter module imported in this process (by anyone, us included): no converter made
    psc = _import_top_down(_CONVERTER_MODULE)  # waits where another thread is importing it

    with psc._cache_df_meta_list_lock:
        if not psc._cache_df_meta_list:
            return None
        # Petastorm keeps the JVM plan (meta.df_plan) of each DataFrame it cached: only a JVM plan compares.
        plan = jvm.analyzed_plan(df)  # classic only (no SparkContext under Spark Connect)
        for meta in psc._cache_df_meta_list:
            if (meta.row_group_size == psc.DEFAULT_ROW_GROUP_SIZE_BYTES and meta.compression_codec == "uncompressed"
                    and meta.dtype == "float32" and meta.parent_cache_dir_url == parent_url
                    and meta.df_plan.sameResult(plan)):
                return meta.cache_dir_url
    return None


@contextlib.contextmanager
def _importing_meanwhile(module: str):
    """Import ``module`` in a thread of its own while the ``with`` block runs (where no one has yet), and wait
    for it at the block's end; the caller then imports it itself, which raises whatever the thread's import
    raised. Why: Petastorm's converter module is slow to import (petastorm, its reader, pyspark.ml), and the
    driver needs it only once the write is done: importing it while the driver waits on the JVM takes it off
    the first fit's path (see BENCHMARKS.md, Spark ML)."""
    thread = None
    if module not in sys.modules:
        thread = threading.Thread(target=_import_quietly, args=(module,), daemon=True, name="spark_dist-import")
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


def _import_quietly(module: str) -> None:
    try:
        _import_top_down(module)
    except Exception:  # noqa: BLE001 -- the caller's own import, after the block, raises it where it belongs
        pass


def _import_top_down(module: str):
    """``module``, imported package first, then each submodule: the order in which a user's own
    ``from petastorm.spark import ...`` takes the import locks. ``importlib.import_module`` of the submodule
    takes its lock before its package's, which can deadlock with a user's thread importing Petastorm at once."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        imported = importlib.import_module(".".join(parts[:depth]))
    return imported


def _remove_written(url: str) -> None:
    """Delete a cache directory this process wrote but no Petastorm converter took over (best effort: a warning
    names what is left)."""
    try:
        delete_dir(url)
    except Exception as exc:  # noqa: BLE001 -- cleanup on an error path: the error itself is what the caller sees
        logger.warning("spark_dist: could not delete the dataset cache %s: %r", url, exc)


def _cache_files(spark, url: str) -> List[str]:
    """The Parquet files of a cache directory, as Spark lists them (any scheme Spark wrote it with), as
    ``scheme://path`` URLs; no Spark job."""
    files = []
    for file_url in session.list_files(spark, url):
        name = file_url.rsplit("/", 1)[-1]
        if name.endswith(".parquet") and not name.startswith(("_", ".")):
            files.append("file://" + file_url[len("file:"):] if file_url.startswith("file:/") and
                         not file_url.startswith("file://") else file_url)
    return files


def _row_count(file_urls) -> int:
    return sum(open_parquet(url).metadata.num_rows for url in file_urls)


def _materialise(spark, df, kinds: Dict[str, str], parent_url: str, ranges: Iterable[str] = ()):
    """Write ``df`` as a Petastorm cache and measure its values in the same job (``DataFrame.observe``).

    Returns ``(converter, owned, stats)``: ``owned`` is False when the user's own Petastorm converter had
    already made this cache (then nothing is written and ``stats`` is ``None``: the caller aggregates).
    Writes the way ``make_spark_converter`` does (row groups, no compression, doubles as float32), but skips
    its second job, a full ``count()`` of what was just written: the write counted its rows itself.
    """
    from pyspark.sql import Observation

    existing = _users_petastorm_cache(spark, df, parent_url)
    if existing is not None:
        psc = _import_top_down(_CONVERTER_MODULE)
        files = _cache_files(spark, existing)
        return psc.SparkDatasetConverter(existing, files, _row_count(files)), False, None
    # SQL text reads the columns by position (schema.by_position); the cache keeps the user's names.
    names = df.columns
    df = _with_arrays(by_position(df), kinds)
    observation = Observation(f"spark_dist_checks_{uuid.uuid4().hex}")
    observed = _as_float32(df.observe(observation, *_value_exprs(df.schema, kinds, ranges))).toDF(*names)
    # What Petastorm's _materialize_df does, through the DataFrame API alone (it also runs under Spark
    # Connect, where Petastorm's own call fails: it asks for a classic session to name the directory).
    url = f"{parent_url}/{time.strftime('%Y%m%d%H%M%S')}-appid-{session.app_id(spark)}-{uuid.uuid4()}"
    # Without dictionaries: Parquet's writer starts every column of every row group with one and falls back to
    # plain values once it overflows, re-encoding what it buffered; on float features that makes the cache's
    # row groups slower to write than a plain write (see BENCHMARKS.md, Scaling with data; bench/bench_scaling.py).
    # Started after this thread's own imports for the write (pyspark.ml.functions, Observation): the two threads
    # never import the same module at once.
    writer = observed.write.option("compression", "uncompressed").option("parquet.block.size", ROW_GROUP_BYTES) \
        .option("parquet.enable.dictionary", "false")
    if any(kind in _LARGE_ROW_KINDS for kind in kinds.values()):
        writer = writer.option("parquet.page.size.row.check.min", _FIRST_SIZE_CHECK_ROWS)
    try:
        with _importing_meanwhile(_CONVERTER_MODULE):
            writer.parquet(url)
        psc = _import_top_down(_CONVERTER_MODULE)
        files = _cache_files(spark, url)
        stats = _observed(observation)
        # The write counted its rows; the footers (read once more by describe_files) only when it did not say.
        rows = stats["rows"] if stats is not None else _row_count(files)
        converter = psc.SparkDatasetConverter(url, files, rows)
    except BaseException:  # a failed write, Petastorm not importing, ...: no converter owns the directory yet
        _remove_written(url)
        raise
    logger.info("spark_dist: materialised %d rows in %d files at %s", len(converter), len(files), url)
    return converter, True, stats
