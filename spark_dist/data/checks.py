"""The value checks of a dataset: what to measure, and the errors (or column stats) the measures make.

The measures are aggregations: the cache write computes them as it goes (``DataFrame.observe``, no job of
its own), or one aggregation job computes them over a cache made before. :func:`_judge` turns them into a
:class:`DatasetError` naming the dataset and column, or into each column's :class:`ColumnStats`.
"""
import logging
import threading
from typing import Any, Dict, Iterable, Optional

from .handle import ColumnStats, DatasetError
from .schema import SCALAR, VECTOR, by_position, position, sql

logger = logging.getLogger(__name__)


def _value_exprs(df_schema, kinds: Dict[str, str], ranges: Iterable[str] = ()) -> list:
    """Aggregations that check a dataset's values: row count; per column nulls; for arrays and vectors the
    min/max length and rows holding null elements; for the number columns in ``ranges`` (what a caller checks
    labels against) min/max, NaNs and non-integers. Only those: every aggregate costs on every row, so a null
    count is skipped where the schema rules nulls out (a non-nullable column, an array of non-null elements).
    SQL text over a DataFrame whose columns are named by position (:func:`.schema.by_position`): ``df_schema``
    gives their types, in order, and ``kinds`` their kinds in the same order, by the user's names (as ``ranges``)."""
    from pyspark.sql import types as T

    exprs = [sql("count(1) AS `rows`")]
    for i, ((column, kind), field) in enumerate(zip(kinds.items(), df_schema.fields)):
        col = position(i)
        if field.nullable or kind == VECTOR:
            exprs.append(sql(f"sum(CAST({col} IS NULL AS BIGINT)) AS `null{i}`"))
        if kind == SCALAR:
            if column not in ranges:
                continue
            value = f"CAST({col} AS DOUBLE)"
            if isinstance(field.dataType, (T.FloatType, T.DoubleType)):
                finite = f"(CASE WHEN NOT isnan({value}) THEN {value} END)"  # Spark orders NaN above every number
                exprs += [sql(f"min({finite}) AS `lo{i}`"), sql(f"max({finite}) AS `hi{i}`"),
                          sql(f"sum(CAST(isnan({value}) AS BIGINT)) AS `nan{i}`"),
                          sql(f"sum(CAST({finite} != floor({finite}) AS BIGINT)) AS `frac{i}`")]
            else:
                exprs += [sql(f"min({value}) AS `lo{i}`"), sql(f"max({value}) AS `hi{i}`")]
        else:
            size = f"(CASE WHEN {col} IS NOT NULL THEN size({col}) END)"
            exprs += [sql(f"min({size}) AS `min{i}`"), sql(f"max({size}) AS `max{i}`")]
            # A lambda runs interpreted, element by element: count null elements only where the type allows them.
            if not isinstance(field.dataType, T.ArrayType) or field.dataType.containsNull:
                exprs.append(sql(f"sum(CAST(exists({col}, x -> x IS NULL) AS BIGINT)) AS `inner{i}`"))
    return exprs


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


def _aggregate_cache(spark, cache_dir_url: str, df_schema, kinds: Dict[str, str],
                     ranges: Iterable[str] = ()) -> Dict[str, Any]:
    """The same measures as the write observes, over a cache made before (one aggregation job)."""
    cache = by_position(spark.read.parquet(cache_dir_url))  # the cache's columns: df_schema's, in order
    return cache.agg(*_value_exprs(df_schema, kinds, ranges)).first().asDict()


def _enough_rows(name: str, rows: int, num_ranks: int) -> None:
    """Refuse a dataset that cannot give every rank a row.

    Raises:
        DatasetError: no rows, or fewer rows than ranks.
    """
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
