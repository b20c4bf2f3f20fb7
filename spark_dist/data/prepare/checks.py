"""The value checks of a dataset: what to measure, and the errors (or column stats) the measures make.

The measures are aggregations: the cache write computes them as it goes (``DataFrame.observe``, no job of
its own), or one aggregation job computes them over a cache made before or a Petastorm input's files
(:func:`_aggregate`). :func:`_kinds_and_stats` turns them into a :class:`DatasetError` naming the dataset and
column, or into each column's :class:`ColumnStats`.
"""
import logging
import threading
from typing import Any, Dict, Iterable, Optional, Tuple

from ..handle import ColumnStats, DatasetError
from ..schema import ARRAY, BINARY, NESTED, SCALAR, SEQUENCE, STRING, VECTOR, by_position, nesting, position, sql

logger = logging.getLogger(__name__)


def _value_exprs(df_schema, kinds: Dict[str, str], ranges: Iterable[str] = ()) -> list:
    """Aggregations that check a dataset's values: row count; per column nulls; for arrays and vectors the
    min/max length and rows holding null elements (for nested arrays, at every level); for the number columns in
    ``ranges`` (what a caller checks labels against) min/max, NaNs and non-integers. Only those: every aggregate
    costs on every row, so a null count is skipped where the schema rules nulls out (a non-nullable column, an
    array of non-null elements), and binary and string columns are measured by their footers instead.
    SQL text over a DataFrame whose columns are named by position (:func:`.schema.by_position`): ``df_schema``
    gives their types, in order, and ``kinds`` their kinds in the same order, by the user's names (as ``ranges``)."""
    from pyspark.sql import types as T

    exprs = [sql("count(1) AS `rows`")]
    for i, ((column, kind), field) in enumerate(zip(kinds.items(), df_schema.fields)):
        col = position(i)
        if field.nullable or kind == VECTOR:
            exprs.append(sql(f"sum(CAST({col} IS NULL AS BIGINT)) AS `null{i}`"))
        if kind in (BINARY, STRING):
            continue
        if kind == NESTED:
            exprs += _nested_exprs(i, field.dataType)
            continue
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


def _nested_exprs(i: int, data_type) -> list:
    """Per level ``k`` of a nested array below the first: the min/max size of its arrays over all rows
    (``min{i}_{k}``, ``max{i}_{k}``) and rows holding a null there (``inner{i}_{k}``). Level ``k`` is the column
    flattened ``k - 2`` times; a row with a null array above gives null there (``flatten``), which the
    aggregates skip, and is counted by the level above."""
    from pyspark.sql import types as T

    col = position(i)
    size = f"(CASE WHEN {col} IS NOT NULL THEN size({col}) END)"
    exprs = [sql(f"min({size}) AS `min{i}`"), sql(f"max({size}) AS `max{i}`")]
    level, t = col, data_type
    for k in range(1, nesting(data_type) + 1):
        if t.containsNull:  # a lambda runs interpreted, element by element: only where the type allows nulls
            exprs.append(sql(f"sum(CAST(exists({level}, x -> x IS NULL) AS BIGINT)) AS `inner{i}_{k}`"))
        if isinstance(t.elementType, T.ArrayType):
            sizes = f"transform({level}, x -> size(x))"
            exprs += [sql(f"min(array_min({sizes})) AS `min{i}_{k + 1}`"),
                      sql(f"max(array_max({sizes})) AS `max{i}_{k + 1}`")]
        level, t = f"flatten({level})", t.elementType
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


def _aggregate(frame, df_schema, kinds: Dict[str, str], ranges: Iterable[str] = ()) -> Dict[str, Any]:
    """The same measures as the write observes, over ``frame`` (one aggregation job): a cache made before
    (``spark.read.parquet``: its columns are ``df_schema``'s, in order), or the files of a Petastorm input."""
    return by_position(frame).agg(*_value_exprs(df_schema, kinds, tuple(ranges))).first().asDict()


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


_FILL = {BINARY: "F.coalesce(F.col({c!r}), F.lit(bytearray()))", STRING: "df.na.fill('', subset=[{c!r}])",
         ARRAY: "F.coalesce(F.col({c!r}), F.array())"}


def _kinds_and_stats(name: str, stats: Dict[str, Any], rows: int, kinds: Dict[str, str], num_ranks: int,
           fixed_length: Iterable[str] = ()) -> Tuple[Dict[str, str], Dict[str, ColumnStats]]:
    """Turn the measures into errors (naming the dataset and column) or into each column's kind and stats.

    The kinds are ``kinds`` but for an array column whose rows differ in length: a :data:`SEQUENCE` from then
    on, unless it is named in ``fixed_length`` (a model's fixed-width input).

    Raises:
        DatasetError: no rows, fewer rows than ranks, nulls, null elements, nested arrays of unequal shape,
            vectors (or arrays in ``fixed_length``) of unequal length, or arrays of no length in every row.
    """
    _enough_rows(name, rows, num_ranks)
    described: Dict[str, ColumnStats] = {}
    settled = dict(kinds)
    for i, (column, kind) in enumerate(kinds.items()):
        where = f"dataset {name!r}: column {column!r}"
        if stats.get(f"null{i}"):
            fill = f" or fill them ({_FILL[kind].format(c=column)})" if kind in _FILL else ""
            raise DatasetError(f"{where} has {stats[f'null{i}']} null values; drop or fill them first, "
                               f"e.g. df.na.drop(subset=[{column!r}]){fill}", name, column)
        if kind in (BINARY, STRING):
            continue
        if kind == NESTED:
            described[column] = _nested_shape(where, name, column, i, stats)
            continue
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
        if lo != hi and kind == ARRAY and column not in fixed_length:
            settled[column] = SEQUENCE  # the loader pads them per batch (or hands them out as a list)
            described[column] = ColumnStats(length_range=(int(lo), int(hi)))
            continue
        if lo != hi:
            raise unequal_lengths(name, column, kind, lo, hi)
        if lo == 0:
            raise DatasetError(f"{where} holds only empty {kind}s", name, column)
        described[column] = ColumnStats(length=int(lo))
    return settled, described


def unequal_lengths(name: str, column: str, kind: str, lo: int, hi: int) -> DatasetError:
    """The error for arrays (or vectors) of unequal length where one length is needed."""
    return DatasetError(f"dataset {name!r}: column {column!r} holds {kind}s of unequal length (from {lo} to {hi}); "
                        "a batch needs one length per column: pad or truncate them first (e.g. F.slice)", name, column)


def _nested_shape(where: str, name: str, column: str, i: int, stats: Dict[str, Any]) -> ColumnStats:
    """A nested column's one shape, from its measures (:func:`_nested_exprs`).

    Raises:
        DatasetError: null elements at some level, arrays of unequal length at some level, or no values.
    """
    depth = 1 + sum(1 for key in stats if key.startswith(f"min{i}_"))
    shape = []
    for k in range(1, depth + 1):
        lo, hi = (stats[f"min{i}"], stats[f"max{i}"]) if k == 1 else (stats[f"min{i}_{k}"], stats[f"max{i}_{k}"])
        if lo != hi:
            raise DatasetError(f"{where} holds nested arrays of unequal shape (at depth {k}, lengths from {lo} to "
                               f"{hi}); a batch needs one shape per column: pad or truncate them first, or flatten "
                               "them (F.flatten) to variable-length arrays", name, column)
        shape.append(int(lo) if lo is not None else 0)  # None: no array at that depth (all empty above)
        if stats.get(f"inner{i}_{k}"):
            what = "null numbers" if k == depth else f"null arrays at depth {k + 1}"
            raise DatasetError(f"{where} has {stats[f'inner{i}_{k}']} rows holding {what}; drop or fill them first "
                               "(e.g. F.transform with F.coalesce)", name, column)
    length = 1
    for n in shape:
        length *= n
    if length == 0:
        raise DatasetError(f"{where} holds only empty nested arrays (shape {tuple(shape)})", name, column)
    return ColumnStats(length=length, shape=tuple(shape))
