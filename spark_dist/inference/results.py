"""The predict function's output to the pandas object the UDF yields: PySpark's rules
(``pyspark.ml.functions._validate_and_transform_prediction_result``) with its error messages.

- a scalar ``return_type`` (byte, short, int, long, float, double, string): an array of ``[rows]`` or
  ``[rows, 1]`` -> a Series;
- ``ArrayType``: a ``[rows, n]`` array -> a Series of rows;
- ``StructType``: a dict of arrays (1-D for scalar fields, 2-D for array fields) or a list of one dict per row
  (scalars, 1-D arrays) -> a DataFrame whose columns are the struct's fields.

Where we are more lenient (nothing PySpark accepts changes): a torch tensor anywhere an array goes is taken as
its numpy array (on the CPU); a list as ``np.asarray``; any ``Mapping`` as a dict; a dict or row missing a field
fails with the field-names message (PySpark: a ``KeyError``); the DataFrame's columns follow the struct's order.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
from pyspark.sql.types import (
    ArrayType, ByteType, DataType, DoubleType, FloatType, IntegerType, LongType, ShortType, StringType, StructType,
)

SCALAR_TYPES = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, StringType)
SAME_LENGTH = "Prediction results must have same length as input data."


def _array(x: Any) -> Any:
    """A torch tensor as a numpy array (detached, on the CPU); a list or tuple as ``np.asarray``."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    return x


def _value(x: Any) -> Any:
    """A row's value: a torch tensor as numpy (a 0-d one as its scalar)."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
        return x[()] if x.ndim == 0 else x
    return x


def _check_names(got, struct: StructType) -> None:
    if set(got) != set(struct.names):
        raise ValueError("Prediction result columns did not match expected return_type columns: expected {}, "
                         "got: {}".format(struct.names, list(got)))


def _struct_from_columns(preds: Mapping, rows: int, struct: StructType) -> pd.DataFrame:
    _check_names(preds.keys(), struct)
    columns = {}
    for field in struct.fields:
        values = _array(preds[field.name])
        if isinstance(field.dataType, ArrayType):
            if len(values.shape) != 2:
                raise ValueError("Prediction results for ArrayType must be two-dimensional.")
            values = list(values)
        elif isinstance(field.dataType, SCALAR_TYPES):
            if len(values.shape) != 1:
                raise ValueError("Prediction results for scalar types must be one-dimensional.")
        else:
            raise ValueError("Unsupported field type in return struct type.")
        if len(values) != rows:
            raise ValueError("Prediction results must have same length as input data")
        columns[field.name] = values
    return pd.DataFrame(columns)


def _struct_from_rows(preds: list, rows: int, struct: StructType) -> pd.DataFrame:
    if len(preds) != rows:
        raise ValueError(SAME_LENGTH)
    preds = [{k: _value(v) for k, v in row.items()} for row in preds]
    _check_names(preds[0].keys(), struct)
    first = preds[0]
    for field in struct.fields:  # PySpark checks the first row
        if isinstance(field.dataType, ArrayType):
            if len(np.shape(first[field.name])) != 1:
                raise ValueError("Prediction results for ArrayType must be one-dimensional.")
        elif isinstance(field.dataType, SCALAR_TYPES):
            if not np.isscalar(first[field.name]):
                raise ValueError("Invalid scalar prediction result.")
        else:
            raise ValueError("Unsupported field type in return struct type.")
    return pd.DataFrame(preds, columns=struct.names)


def _scalar_values(preds, rows: int) -> np.ndarray:
    """A scalar type's ``[rows]`` values of a ``[rows]`` or ``[rows, 1]`` output (PySpark's checks)."""
    if len(preds) != rows:
        raise ValueError(SAME_LENGTH)
    if not (len(preds.shape) == 1 or (len(preds.shape) == 2 and preds.shape[1] == 1)):
        raise ValueError("Invalid shape for scalar prediction result.")
    return np.squeeze(preds, -1) if len(preds.shape) > 1 else preds


def to_arrow(preds: Any, rows: int, return_type: DataType, arrow_type):
    """:func:`to_pandas`'s result as the Arrow array (of ``arrow_type``) an Arrow UDF yields, with its checks and
    messages. A numpy output of a scalar or array type goes over without pandas (an array type's rows are not
    split into per-row objects).

    Raises:
        ValueError: as :func:`to_pandas`.
    """
    import pyarrow as pa

    if not isinstance(return_type, (StructType, ArrayType)) and isinstance(return_type, SCALAR_TYPES):
        preds = _array(preds)
        if isinstance(preds, np.ndarray) and preds.dtype != np.object_:
            return pa.array(_scalar_values(preds, rows)).cast(arrow_type, safe=False)
    if isinstance(return_type, ArrayType) and not isinstance(return_type.elementType, (StructType, ArrayType)):
        preds = _array(preds)
        if isinstance(preds, np.ndarray) and preds.dtype != np.object_ and len(preds.shape) == 2:
            if len(preds) != rows:
                raise ValueError(SAME_LENGTH)
            width = preds.shape[1]
            values = pa.array(np.ascontiguousarray(preds).reshape(-1)).cast(arrow_type.value_type, safe=False)
            offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, values).cast(arrow_type)
    out = to_pandas(preds, rows, return_type)
    if isinstance(out, pd.DataFrame):
        return pa.StructArray.from_arrays(
            [pa.Array.from_pandas(out[f.name], type=arrow_type.field(f.name).type) for f in return_type.fields],
            fields=list(arrow_type))
    return pa.Array.from_pandas(out, type=arrow_type)


def to_pandas(preds: Any, rows: int, return_type: DataType):
    """The UDF's output for ``rows`` input rows.

    Raises:
        ValueError: the output does not fit ``return_type`` (PySpark's messages), or the type is not supported.
    """
    if isinstance(return_type, StructType):
        if isinstance(preds, Mapping):
            return _struct_from_columns(preds, rows, return_type)
        if isinstance(preds, list) and (not preds or isinstance(preds[0], Mapping)):
            return _struct_from_rows(preds, rows, return_type)
        raise ValueError("Prediction results for StructType must be a dictionary or a list of dictionary, "
                         "got: {}".format(type(preds)))
    preds = _array(preds)
    if isinstance(return_type, ArrayType):
        if not isinstance(preds, np.ndarray):
            raise ValueError("Prediction results for ArrayType must be an ndarray.")
        if len(preds) != rows:
            raise ValueError(SAME_LENGTH)
        if len(preds.shape) != 2:
            raise ValueError("Prediction results for ArrayType must be two-dimensional.")
        return pd.Series(list(preds))
    if isinstance(return_type, SCALAR_TYPES):
        output = _scalar_values(preds, rows)
        return pd.Series(output).astype(output.dtype)
    raise ValueError("Unsupported return type")
