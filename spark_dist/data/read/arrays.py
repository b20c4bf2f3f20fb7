"""Columns of the cache's Parquet files as numpy arrays and torch dtypes, without pandas and without copies
where pyarrow's buffers allow it."""
from typing import Optional

import numpy as np

from ..handle import DatasetError


def torch_dtype(value, column: str, dataset: str):
    import torch

    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)
    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(value))).dtype
    except (TypeError, ValueError):
        raise DatasetError(f"dataset {dataset!r}: dtypes[{column!r}] = {value!r} is not a torch or numpy "
                           "dtype (e.g. torch.float16 or 'float64')") from None


def default_dtype(cache_dtype: str):
    import torch

    kind = np.dtype(cache_dtype).kind
    # Models want float32 features and int64 class labels (what cross_entropy expects), whatever Spark had.
    return {"f": torch.float32, "i": torch.int64, "u": torch.int64, "b": torch.bool}[kind]


def numpy_dtype(torch_dtype) -> Optional[np.dtype]:
    import torch

    try:
        return torch.empty(0, dtype=torch_dtype).numpy().dtype
    except TypeError:  # bfloat16 and friends: cast the tensor per batch instead
        return None


_FLOAT_NAMES = {"halffloat": "float16", "float": "float32", "double": "float64"}  # arrow's names; ints share numpy's


def to_numpy(arr) -> np.ndarray:
    """A pyarrow array as numpy: a view of its values buffer where it is a number array without nulls (what
    the cache holds), else pyarrow's own conversion. Why not always ``to_numpy``: it imports pandas on its first
    call in a process, which is slow, and every rank is a new process whose first batch would wait for that
    (see BENCHMARKS.md, Spark ML)."""
    import pyarrow as pa

    if arr.null_count == 0 and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        buffers = arr.buffers()  # a new list of Buffer objects each call: once per chunk and column
        if len(buffers) == 2:
            # By the type's name: pyarrow 14's to_pandas_dtype() imports pandas too.
            dtype = np.dtype(_FLOAT_NAMES.get(str(arr.type), str(arr.type)))
            return np.frombuffer(buffers[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)


def list_values(arr) -> np.ndarray:
    """The values of a list array's rows, in order, as one flat numpy array (no copy where :func:`to_numpy`
    takes none). Sliced by the offsets rather than ``flatten()``, which imports pyarrow.compute on its first
    call in a rank, delaying that rank's first batch."""
    if arr.null_count == 0 and hasattr(arr, "offsets") and len(arr):
        start, end = arr.offsets[0].as_py(), arr.offsets[-1].as_py()
        return to_numpy(arr.values.slice(start, end - start))
    return arr.flatten().to_numpy(zero_copy_only=False)


def rows_view(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array of rows as a 1-D array of opaque row values (no copy when already contiguous)."""
    array = np.ascontiguousarray(array)
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    return array.view(np.dtype((np.void, row_bytes))).reshape(len(array))


def nested_values(arr) -> np.ndarray:
    """The numbers of a nested list array's rows (lists of lists of ...), in order, as one flat numpy array: each
    level sliced by its offsets, as :func:`list_values` does one (no copy where :func:`to_numpy` takes none)."""
    import pyarrow as pa

    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        start, end = arr.offsets[0].as_py(), arr.offsets[-1].as_py()  # a null row spans no values: none here
        arr = arr.values.slice(start, end - start)
    return to_numpy(arr)
