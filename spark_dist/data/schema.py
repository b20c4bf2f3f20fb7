"""Column kinds from a schema alone (no Spark job): which Spark types the loaders turn into tensors.

The one definition of "which Spark type is which kind", shared by the dataset cache (:func:`column_kinds`,
whose errors name the dataset and column) and the ML stages (:func:`spark_dist.ml.inputs.column_kind`, whose
errors name the Param). PySpark is imported on first use only: the kind names also reach the ranks (through
:mod:`.handle`), where there is no Spark.
"""
from typing import Dict, Optional

from ..errors import DatasetError

SCALAR, ARRAY, VECTOR = "scalar", "array", "vector"


def quoted(name: str) -> str:
    """``name`` as ``DataFrame.select`` takes a column name literally: a dot in it is not a struct field, a backtick
    not a quote. (SQL text may still read it as a regex: see :func:`by_position`.)"""
    return "`" + name.replace("`", "``") + "`"


def sql(text: str):
    """A Column from SQL text (``F.expr``), the way spark_dist builds every Column it needs; the text names
    columns by :func:`position`, never by the user's names.

    Never ``F.col`` or a ``Column`` method: on PySpark 4 each of those records its caller's stack for error
    messages (py4j calls), and the first one in a process imports IPython where it is installed
    (``pyspark.errors.utils._capture_call_site``), a slow import that delays a script's first fit (see
    BENCHMARKS.md, Spark ML). ``F.expr`` and the DataFrame methods that take SQL text or column names do
    neither.
    """
    from pyspark.sql import functions as F

    return F.expr(text)


def position(index: int) -> str:
    """The name :func:`by_position` gives the column at ``index``."""
    return f"_{index}"


def by_position(df):
    """``df`` with its columns renamed ``_0``, ``_1``, ... in order (``toDF``: no Column method), for SQL text.

    A user's name is not always literal in SQL text, even backticked: with
    ``spark.sql.parser.quotedRegexColumnNames=true`` (which feature-store tools set) a backticked name holding a
    dot or a space is read as a regex. Renamed back by ``toDF(*df.columns)`` (a DataFrame keeps its schema once
    asked, so asking again costs nothing).
    """
    return df.toDF(*[position(i) for i in range(len(df.columns))])


def kind_of(data_type) -> Optional[str]:
    """:data:`VECTOR` (an ML vector, ``pyspark.ml`` or the old ``pyspark.mllib``), :data:`ARRAY` (of numbers)
    or :data:`SCALAR` (a number) for a Spark type the loaders take; ``None`` for any other type."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT
    from pyspark.sql import types as T

    numbers = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.BooleanType)
    if isinstance(data_type, (VectorUDT, OldVectorUDT)):
        return VECTOR
    if isinstance(data_type, numbers):
        return SCALAR
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, numbers):
        return ARRAY
    return None


def column_kinds(name: str, df) -> Dict[str, str]:
    """``{column: "scalar" | "array" | "vector"}`` from the schema alone.

    Raises:
        DatasetError: a column of another type (string, struct, map, decimal, nested array, ...), duplicate
            column names, or no columns.
    """
    from pyspark.sql import types as T

    kinds: Dict[str, str] = {}
    for field in df.schema.fields:
        t = field.dataType
        if field.name in kinds:
            raise DatasetError(f"dataset {name!r}: column name {field.name!r} appears twice; rename one")
        kind = kind_of(t)
        if kind is None:
            hint = ("cast it to double: F.col(...).cast('double')"
                    if isinstance(t, T.DecimalType) or (isinstance(t, T.ArrayType)
                                                        and isinstance(t.elementType, T.DecimalType))
                    else f"drop it (df.drop({field.name!r})) or turn it into numbers first "
                         "(e.g. StringIndexer, VectorAssembler)")
            raise DatasetError(
                f"dataset {name!r}: column {field.name!r} has type {t.simpleString()}, which the loader cannot "
                "turn into a tensor (supported: numeric scalars, arrays of numbers, pyspark.ml.linalg vectors); "
                + hint)
        kinds[field.name] = kind
    if not kinds:
        raise DatasetError(f"dataset {name!r}: the DataFrame has no columns")
    return kinds
