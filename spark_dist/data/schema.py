"""Column kinds from a schema alone (no Spark job): which Spark types the loaders turn into tensors.

The one definition of "which Spark type is which kind", shared by the dataset cache (:func:`column_kinds`,
whose errors name the dataset and column) and the ML stages (:func:`spark_dist.ml.inputs.column_kind`, whose
errors name the Param). The ML stages take the number kinds only (:func:`kind_of`); the dataset cache takes
every kind the loader can hand to a training loop (:func:`loader_kind`). PySpark is imported on first use only:
the kind names also reach the ranks (through :mod:`.handle`), where there is no Spark.
"""
from typing import Dict, Optional

from ..errors import DatasetError

SCALAR, ARRAY, VECTOR = "scalar", "array", "vector"
# The loader's other kinds. SEQUENCE is never a schema's answer: the write measures an ARRAY column's lengths,
# and one whose rows differ in length is a SEQUENCE from then on (.checks._kinds_and_stats).
BINARY, STRING, NESTED, SEQUENCE = "binary", "string", "nested", "sequence"
NUMBER_KINDS = (SCALAR, ARRAY, VECTOR, NESTED)  # fixed-size numbers per row: the loader's numpy path


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


def nesting(data_type) -> int:
    """How many arrays deep ``data_type``'s values are: 0 for a non-array, 1 for ``array<x>``, 2 for
    ``array<array<x>>``, ..."""
    from pyspark.sql import types as T

    depth = 0
    while isinstance(data_type, T.ArrayType):
        data_type, depth = data_type.elementType, depth + 1
    return depth


def leaf_type(data_type):
    """The type of the values at the bottom of ``data_type``'s arrays (``data_type`` itself for a non-array)."""
    from pyspark.sql import types as T

    while isinstance(data_type, T.ArrayType):
        data_type = data_type.elementType
    return data_type


def loader_kind(data_type) -> Optional[str]:
    """The dataset cache's kind of a Spark type: :func:`kind_of`'s number kinds, and :data:`BINARY`,
    :data:`STRING` and :data:`NESTED` (arrays of arrays of numbers); ``None`` for a type the loader cannot hand
    to a training loop (map, struct, decimal, date, arrays of strings, ...). An array of numbers is
    :data:`ARRAY` here whatever its rows' lengths: the write measures them."""
    from pyspark.sql import types as T

    kind = kind_of(data_type)
    if kind is not None:
        return kind
    strings = tuple(getattr(T, n) for n in ("StringType", "CharType", "VarcharType") if hasattr(T, n))
    if isinstance(data_type, T.BinaryType):
        return BINARY
    if isinstance(data_type, strings):
        return STRING
    if nesting(data_type) >= 2 and kind_of(leaf_type(data_type)) == SCALAR:
        return NESTED
    return None


def _refusal_hint(column: str, t) -> str:
    """What to do with a column of type ``t``, which the loader cannot take."""
    from pyspark.sql import types as T

    leaf = leaf_type(t)
    if isinstance(leaf, T.DecimalType):
        return "cast it to double: F.col(...).cast('double')"
    if isinstance(t, T.StructType):
        return (f"select its fields as columns of their own (df.select('*', '{column}.*').drop({column!r})), or "
                f"turn it into one string (F.to_json({column!r}))")
    if isinstance(t, T.MapType):
        return (f"select the values you need as columns (F.col({column!r})['key']), or turn it into one string "
                f"(F.to_json({column!r}))")
    if isinstance(leaf, (T.DateType, T.TimestampType)) or type(leaf).__name__ == "TimestampNTZType":
        return "cast it to a number (F.unix_timestamp(...), or .cast('long') for seconds) or to a string"
    if isinstance(t, T.ArrayType):
        return (f"turn it into one string (F.to_json({column!r}) or F.concat_ws), or into numbers (e.g. an index "
                "per value: StringIndexer, a vocabulary)")
    return f"drop it (df.drop({column!r})) or turn it into numbers first (e.g. StringIndexer, VectorAssembler)"


def column_kinds(name: str, df) -> Dict[str, str]:
    """``{column: kind}`` from the schema alone, one of :func:`loader_kind`'s kinds.

    Raises:
        DatasetError: a column of another type (struct, map, decimal, date, arrays of strings, ...; the message
            says what to do instead), duplicate column names, or no columns.
    """
    kinds: Dict[str, str] = {}
    for field in df.schema.fields:
        t = field.dataType
        if field.name in kinds:
            raise DatasetError(f"dataset {name!r}: column name {field.name!r} appears twice; rename one")
        kind = loader_kind(t)
        if kind is None:
            raise DatasetError(
                f"dataset {name!r}: column {field.name!r} has type {t.simpleString()}, which the loader cannot "
                "turn into a tensor (supported: numbers, arrays and nested arrays of numbers, pyspark.ml.linalg "
                "vectors, binary, string); " + _refusal_hint(field.name, t), name, field.name)
        kinds[field.name] = kind
    if not kinds:
        raise DatasetError(f"dataset {name!r}: the DataFrame has no columns")
    return kinds
