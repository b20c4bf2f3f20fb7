"""One Arrow batch, as the pandas UDF receives it, to the numpy arrays the predict function takes: PySpark's
rules (``pyspark.ml.functions._validate_and_transform_*_input``) with their error messages, and two additions.

PySpark's rules, for the columns the UDF was called with (a struct column counts as its fields):

- a scalar column -> a 1-D array (numbers; ``str`` / ``bytes`` objects for string and binary columns);
- an array column with a shape -> ``[rows, *shape]``, the flattened rows stacked and reshaped;
- an array column needs ``input_tensor_shapes`` (a list, or ``{index: shape}``); in a list, ``None`` (or
  ``[]``) for a column of a predict function with several inputs passes that column as it is: a 1-D object
  array holding one numpy array per row;
- a predict function with one input and several scalar columns in a struct -> one ``[rows, columns]`` array.

Additions: ``None`` as the shape of a predict function's only input passes that column as it is too (PySpark
fails there with a ``TypeError``), so variable-length and nested arrays reach a one-input predict function as
an object array of per-row arrays; and fixed-length numeric rows are stacked with one ``np.concatenate`` per
Arrow batch instead of ``np.vstack`` per ``batch_size`` rows (the same array; ragged rows still fail with
numpy's own ``np.vstack`` error).
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

TENSORS_NEED_SHAPES = "Tensor columns require input_tensor_shapes"
SHAPE_MISMATCH = "Input data does not match expected shape."
SINGLE_INPUT = ("Multiple input columns found, but model expected a single input, use `array` to combine "
                "columns into tensors.")

Shapes = Optional[List[Optional[List[int]]]]


def dense_shapes(input_tensor_shapes, inputs: int) -> Shapes:
    """``input_tensor_shapes`` as a list with one shape (or ``None``) per input of the predict function, each
    shape a list (PySpark reads a ``{index: shape}`` dict the same way; it wants lists where we take tuples)."""
    if input_tensor_shapes is None:
        return None
    if isinstance(input_tensor_shapes, Mapping):
        shapes: list = [None] * inputs
        for index, shape in input_tensor_shapes.items():
            if not 0 <= index < inputs:
                raise ValueError(f"input_tensor_shapes has a shape for input {index}, but the predict function "
                                 f"takes {inputs} input(s)")
            shapes[index] = shape
    else:
        shapes = list(input_tensor_shapes)
    return [None if s is None else list(s) for s in shapes]


def _columns(data) -> List[pd.Series]:
    """The UDF's argument columns in order, a struct argument (a DataFrame) as its fields: what PySpark's
    ``pd.concat(data, axis=1)`` makes of them, without the copy."""
    parts = data if isinstance(data, tuple) else (data,)
    out: List[pd.Series] = []
    for part in parts:
        if isinstance(part, pd.DataFrame):
            out.extend(part.iloc[:, i] for i in range(part.shape[1]))
        else:
            out.append(part)
    return out


def _is_tensor(column: pd.Series) -> bool:
    """An array column: PySpark looks at the first row; so do we, skipping nulls."""
    if column.dtype != np.object_ or len(column) == 0:
        return False
    first = column.iloc[0]
    if first is None:
        index = column.first_valid_index()
        first = None if index is None else column[index]
    return isinstance(first, (np.ndarray, list))


def _stack(rows: np.ndarray) -> np.ndarray:
    """Rows of an array column as one ``[rows, width]`` array: ``np.vstack``'s result, made by one
    ``np.concatenate`` when every row is a 1-D numeric array of the same length (else ``np.vstack`` itself,
    with its own error for ragged rows)."""
    first = rows[0] if len(rows) else None
    if isinstance(first, np.ndarray) and first.ndim == 1 and first.dtype != np.object_:
        try:
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            if (lengths == len(first)).all():
                flat = np.concatenate(rows)
                if flat.dtype != np.object_:
                    return flat.reshape(len(rows), len(first))
        except (TypeError, ValueError):  # a row of another kind (a None, 2-D): np.vstack says what
            pass
    return np.vstack(rows)


def _is_arrow_list(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _dense_rows(array) -> Optional[np.ndarray]:
    """A list column of numbers as one ``[rows, width]`` array (the stacked rows ``_stack`` makes of the
    per-row arrays), without a copy; ``None`` unless no row or element is null and every row has one length."""
    import pyarrow as pa

    kind = array.type.value_type
    if array.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or len(array) == 0:
        return None
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
    else:
        offsets = array.offsets.to_numpy()
        width = int(offsets[1] - offsets[0])
        if not (np.diff(offsets) == width).all():
            return None
    flat = array.flatten()
    if flat.null_count:
        return None
    return flat.to_numpy(zero_copy_only=False).reshape(len(array), width)


def _arrow_numpy(array) -> np.ndarray:
    """What the pandas UDF's ``Series.to_numpy()`` gives for this Arrow column: numbers without nulls as they
    are (no copy), strings and bytes without nulls as object arrays, else pyarrow's pandas conversion (nulls as
    NaN or None, lists as per-row arrays)."""
    import pyarrow as pa

    kind = array.type
    if not array.null_count and (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                 or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                 or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return array.to_numpy(zero_copy_only=False)  # strings and bytes: one object each, as pandas makes them
    return array.to_pandas(date_as_object=True).to_numpy()


def _reshape(x: np.ndarray, shape: Sequence[int], rows: int) -> np.ndarray:
    x = x.reshape([-1] + list(shape))
    if len(x) != rows:
        raise ValueError(SHAPE_MISMATCH)
    return x


class ArrowBatch:
    """The columns of one Arrow batch, cut into ``batch_size`` rows for the predict function: built from the
    pandas objects a pandas UDF receives (:meth:`from_pandas`) or from the Arrow arrays themselves
    (:meth:`from_arrow`), which give the predict function the same numpy arrays."""

    def __init__(self, values: List[np.ndarray], tensor: List[bool], has_tuple: bool, rows: int,
                 stacked: Optional[dict] = None, rows_of=None):
        self.has_tuple = has_tuple  # several UDF arguments (else one column, or one struct)
        self._values = values  # per column, what ``Series.to_numpy()`` gives; None where ``rows_of`` makes it
        self._rows_of = rows_of
        self.width = len(tensor)
        self.rows = rows
        self.tensor = tensor
        self.has_tensors = any(tensor)
        self._stacked: dict = stacked or {}

    @classmethod
    def from_pandas(cls, data) -> "ArrowBatch":
        """A pandas UDF's input: a Series, a DataFrame (a struct argument) or a tuple of them."""
        columns = _columns(data)
        return cls([c.to_numpy() for c in columns], [_is_tensor(c) for c in columns], isinstance(data, tuple),
                   len(columns[0]) if columns else 0)

    @classmethod
    def from_arrow(cls, data) -> "ArrowBatch":
        """An Arrow UDF's input: a ``pyarrow.Array``, a ``StructArray`` (a struct argument) or a tuple of them.
        A list column of numbers with no nulls and one length is handed on stacked, without a copy; the
        per-row arrays (what pandas makes of it) are made only where the predict function takes them."""
        import pyarrow as pa

        parts = data if isinstance(data, tuple) else (data,)
        arrays = []
        for part in parts:
            arrays.extend(part.flatten() if pa.types.is_struct(part.type) else [part])
        values, tensor, stacked = [], [], {}
        for i, array in enumerate(arrays):
            is_list = _is_arrow_list(array.type)
            tensor.append(is_list and array.null_count < len(array))
            dense = _dense_rows(array) if is_list else None
            if dense is not None:
                stacked[i] = dense
                values.append(None)
            else:
                values.append(_arrow_numpy(array))
        lazy = dict(enumerate(arrays))
        return cls(values, tensor, isinstance(data, tuple), len(arrays[0]) if arrays else 0, stacked,
                   rows_of=lambda i: _arrow_numpy(lazy[i]))

    @property
    def values(self) -> List[np.ndarray]:
        if any(v is None for v in self._values):
            self._values = [self._rows_of(i) if v is None else v for i, v in enumerate(self._values)]
        return self._values

    def _rows_stacked(self, i: int, start: int, stop: int) -> np.ndarray:
        """``np.vstack`` of the column's rows ``start:stop``; an array column is stacked once for the batch."""
        if not self.tensor[i]:
            return np.vstack(self.values[i][start:stop])
        if i not in self._stacked:
            self._stacked[i] = _stack(self.values[i])
        return self._stacked[i][start:stop]

    def multiple(self, start: int, stop: int, shapes: Shapes) -> List[np.ndarray]:
        """One array per column, for a predict function with as many inputs."""
        if not shapes:
            return [v[start:stop] for v in self.values]
        if len(shapes) != self.width:
            raise ValueError("input_tensor_shapes must match columns")
        out = [_reshape(self._rows_stacked(i, start, stop), shape, stop - start) if shape
               else self.values[i][start:stop] for i, shape in enumerate(shapes)]
        if not all(len(x) == stop - start for x in out):
            raise ValueError(SHAPE_MISMATCH)
        return out

    def single(self, start: int, stop: int, shapes: Shapes) -> np.ndarray:
        """The one array for a predict function with one input."""
        rows = stop - start
        first_shape = shapes[0] if shapes else None
        if self.has_tensors:
            if self.width != 1:
                raise ValueError(SINGLE_INPUT)
            if shapes and first_shape is None:  # ours: the rows as they are (variable length, nested)
                x = self.values[0][start:stop]
            else:
                x = self._rows_stacked(0, start, stop)
        elif self.width == 1:
            x = self.values[0][start:stop]
            if shapes and first_shape not in (None, [], [1]):
                raise ValueError("Invalid input_tensor_shape for scalar column.")
        elif not self.has_tuple:  # the fields of one struct argument: pandas' common type, as PySpark
            x = pd.DataFrame({i: v[start:stop] for i, v in enumerate(self.values)}).to_numpy()
            if shapes and first_shape != [self.width]:
                raise ValueError(SHAPE_MISMATCH)
        else:
            raise ValueError(SINGLE_INPUT)
        if shapes:
            if len(shapes) != 1:
                raise ValueError("Multiple input_tensor_shapes found, but model expected one input")
            if first_shape is not None:
                x = _reshape(x, first_shape, rows)
        return x
