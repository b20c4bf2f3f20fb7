"""The contract: what travels from the driver to each rank, a picklable description of one dataset.

A :class:`DatasetHandle` names the dataset's Parquet files, their row groups and its columns
(:class:`ColumnInfo`, with what the driver measured, :class:`ColumnStats`; a Petastorm codec column as a
:class:`CodecColumn`). The driver's room makes it (:func:`describe_files`, from the files' footers), the rank's
room reads with it; neither room is imported here. No Spark here: ranks import this module inside their task
processes, where only files are at hand.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from ..errors import DatasetError
from .codecs import NDARRAY, fixed_shape
from .schema import (ARRAY, BINARY, NESTED, NUMBER_KINDS, SCALAR, SEQUENCE, STRING,  # noqa: F401 -- a ColumnInfo's
                     VECTOR)  # kinds, importable from here as before
from .urls import open_parquet


@dataclass(frozen=True)
class ColumnStats:
    """What the driver measured of one column while materialising it (before the float32 narrowing).

    ``length``: values per row of an array, vector or nested column (for a nested one, the product of
    ``shape``, each row's shape). ``length_range``: the shortest and longest array of a sequence column (arrays
    of numbers whose rows differ in length). For the number columns a caller asked ranges of: ``minimum``,
    ``maximum`` (NaN left out; ``None`` when there is no number), ``nans``, and ``non_integers``, how many values
    have a fraction.
    """

    length: Optional[int] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    non_integers: int = 0
    nans: int = 0
    shape: Optional[Tuple[int, ...]] = None
    length_range: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class ColumnInfo:
    """One column of a cached dataset.

    ``kind`` is ``"scalar"``, ``"array"`` (of one length), ``"vector"`` (an ML vector, stored densely as an
    array), ``"nested"`` (arrays of arrays of numbers, one shape), ``"sequence"`` (arrays of numbers of
    varying length), ``"binary"`` or ``"string"``; ``dtype`` is the numpy dtype of the values in the cache
    (``"float32"``, ``"int64"``, ...; ``"object"`` for binary and string); ``stats`` holds the length of an
    array or vector column, the shape of a nested one, the range of a number column. ``row_bytes``: the
    average bytes a row of a binary, string or sequence column takes in the cache (from the files' footers),
    which sizes the loader's shuffle window.
    """

    name: str
    kind: str
    dtype: str
    stats: ColumnStats = ColumnStats()
    row_bytes: Optional[float] = None

    @property
    def length(self) -> Optional[int]:
        """Values per row of an array, vector or nested column (``None`` for numbers and the variable kinds)."""
        return self.stats.length

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Each row's shape: ``()`` for a number, ``(length,)`` for an array or vector, the measured shape of a
        nested column; ``None`` for the kinds whose rows differ in size (sequence, binary, string)."""
        if self.kind == SCALAR:
            return ()
        if self.kind == NESTED:
            return self.stats.shape
        return (self.length,) if self.kind in (ARRAY, VECTOR) else None


@dataclass(frozen=True)
class CodecColumn(ColumnInfo):
    """A ``binary`` column of a Petastorm dataset that a Unischema codec wrote, decoded per batch by the ranks
    (:func:`spark_dist.data.read.petastorm_codecs.decoded_batch`).

    ``codec``: :data:`.codecs.IMAGE`, :data:`.codecs.NDARRAY` or :data:`.codecs.COMPRESSED_NDARRAY`;
    ``value_dtype`` and ``value_shape``: the Unischema field's numpy dtype and shape (``None`` for a dimension of
    any size); ``codec_name``: the codec as Petastorm writes it (``CompressedImageCodec('png', 80)``), for messages.
    """

    codec: str = NDARRAY
    value_dtype: str = "float64"
    value_shape: Optional[Tuple[Optional[int], ...]] = None
    codec_name: str = ""

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Each row's shape where the Unischema gives one (no ``None`` in it), else ``None``."""
        return fixed_shape(self.value_shape)


@dataclass(frozen=True)
class DatasetHandle:
    """A dataset materialised once by :func:`prepare_datasets`, as each rank needs it.

    ``file_urls`` are the Parquet files of the Petastorm cache in a fixed (sorted) order and
    ``row_group_rows[i]`` the row counts of the row groups of ``file_urls[i]``: with them a rank computes its
    exact share of rows without asking anyone.
    """

    name: str
    cache_dir_url: str
    file_urls: Tuple[str, ...]
    row_group_rows: Tuple[Tuple[int, ...], ...]
    num_rows: int
    columns: Tuple[ColumnInfo, ...]

    @property
    def column_names(self) -> Tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> ColumnInfo:
        """The column called ``name``.

        Raises:
            DatasetError: no such column (the message lists the dataset's columns).
        """
        for c in self.columns:
            if c.name == name:
                return c
        raise DatasetError(f"dataset {self.name!r} has no column {name!r}; "
                           f"its columns are: {', '.join(self.column_names)}")


def describe_files(name: str, cache_dir_url: str, file_urls: Sequence[str], kinds: Dict[str, str],
                   stats: Dict[str, ColumnStats], codecs: Optional[Dict[str, dict]] = None) -> DatasetHandle:
    """Build the handle of Parquet files from their footers (row groups, value types).

    ``kinds`` and ``stats`` come from the driver's schema check and measures; the value dtypes are read
    from the files themselves, because the Petastorm converter may have narrowed them (double -> float), and
    so are the bytes of the variable kinds' rows (their column chunks' sizes: the cache is uncompressed).
    ``codecs`` (a Petastorm dataset's: column -> the fields of its :class:`CodecColumn`) makes each of those
    columns a :class:`CodecColumn`, decoded by the ranks; a shuffle window counts such a column's rows at their
    decoded size where the Unischema gives their shape.
    """
    import numpy as np
    import pyarrow as pa

    urls = tuple(sorted(file_urls))  # Spark lists them in no fixed order; every rank must agree on one
    row_groups, dtypes, total, leaf_of, chunk_bytes = [], {}, 0, {}, {}
    for url in urls:
        pf = open_parquet(url)
        md = pf.metadata
        row_groups.append(tuple(md.row_group(i).num_rows for i in range(md.num_row_groups)))
        total += md.num_rows
        if not dtypes:
            for field in pf.schema_arrow:
                t, leaf_of[field.name] = field.type, len(dtypes)
                while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
                    t = t.value_type
                dtypes[field.name] = np.dtype(t.to_pandas_dtype()).name
            # Every kind the cache holds is one Parquet leaf column per top-level column, in order: else unknown.
            leaf_of = leaf_of if md.num_columns == len(dtypes) else {}
        for c in (c for c in kinds if kinds[c] in (BINARY, STRING, SEQUENCE) and c in leaf_of):
            chunk_bytes[c] = chunk_bytes.get(c, 0) + sum(md.row_group(g).column(leaf_of[c]).total_uncompressed_size
                                                         for g in range(md.num_row_groups))
    columns = tuple(ColumnInfo(c, kinds[c], dtypes[c], stats.get(c, ColumnStats()),
                               chunk_bytes[c] / max(total, 1) if c in chunk_bytes else None) for c in kinds)
    columns = tuple(_codec_column(c, (codecs or {})[c.name]) if c.name in (codecs or {}) else c for c in columns)
    return DatasetHandle(name=name, cache_dir_url=cache_dir_url, file_urls=urls,
                         row_group_rows=tuple(row_groups), num_rows=total, columns=columns)


def _codec_column(column: ColumnInfo, spec: dict) -> CodecColumn:
    """``column`` as the :class:`CodecColumn` ``spec`` describes; its rows counted at least at their decoded size."""
    import numpy as np

    shape, decoded = fixed_shape(spec["value_shape"]), 0
    if shape is not None:
        itemsize = np.dtype(spec["value_dtype"]).itemsize if spec["value_dtype"] != "object" else 0
        decoded = int(np.prod(shape, dtype=np.int64)) * itemsize
    return CodecColumn(column.name, column.kind, column.dtype, column.stats,
                       max(column.row_bytes or 0, decoded) or None, **spec)
