"""The contract of the ``transformFn`` and ``inferenceTransformFn`` Params, the same on a rank during ``fit`` and in
a Python worker during ``TorchModel.transform``. Nothing here imports Spark or pandas.

A transform is called on a batch of rows: a dict holding each ``featuresCol`` column as spark_dist's loader
hands it to a training loop (``ctx.loader``), never the label:

- ``binary``: a list of ``bytes``; ``string``: a list of ``str``;
- numbers: a tensor ``[rows]`` (float32, int64 or bool); arrays of one length and ML vectors ``[rows, length]``;
  nested arrays ``[rows, *shape]``;
- arrays of numbers of varying length: a tensor ``[rows, longest]`` padded with 0 on the right, and the int64
  lengths under ``"<column>_lengths"``.

It returns the model's input:

- a tensor: ``model(x)``;
- a tuple or list of tensors: ``model(*x)``;
- a dict of tensors: ``model(**x)`` (keyword arguments, as Hugging Face models take ``input_ids`` and
  ``attention_mask``); a dict of one entry: ``model(value)``, whatever its key.

The labels come from ``labelCol``, outside the transform, so the same function serves inference, where no
label exists. During ``fit`` the transform runs in the loader's worker processes (``transformWorkers``), with
``random``, ``numpy.random`` and torch seeded per batch from ``(seed, epoch, batch)``; at inference it runs
in the Python worker of each Spark task, on chunks of ``batchSize`` rows of each Arrow batch.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

# The loader's column kinds (spark_dist.data.schema), by value: the ranks import this module without Spark.
SCALAR, ARRAY, VECTOR, NESTED, SEQUENCE, BINARY, STRING = (
    "scalar", "array", "vector", "nested", "sequence", "binary", "string")


def forward(module, inputs):
    """``module`` applied to what a transform returned (see the module's docstring).

    Raises:
        TypeError: ``inputs`` is none of a tensor, a tuple or list, or a dict.
    """
    import torch

    if isinstance(inputs, torch.Tensor):
        return module(inputs)
    if isinstance(inputs, dict):
        if len(inputs) == 1:
            return module(next(iter(inputs.values())))
        return module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return module(*inputs)
    raise TypeError(f"the transform returned a {type(inputs).__name__}; it must return the model's input: a "
                    "tensor, a tuple of tensors, or a dict of tensors")


def to_device(inputs, device):
    """What a transform returned, its tensors on ``device``."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    if isinstance(inputs, dict):
        return {k: to_device(v, device) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(to_device(v, device) for v in inputs)
    return inputs


class FitTransform:
    """The loader's transform during ``fit``: the user's ``fn`` on the batch's feature columns, the label kept
    beside it. A class at module level, so the loader's worker processes unpickle it by reference."""

    def __init__(self, fn, label: str):
        self.fn, self.label = fn, label

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        lengths = f"{self.label}_lengths"
        features = {k: v for k, v in batch.items() if k not in (self.label, lengths)}
        return {"label": batch[self.label], "inputs": self.fn(features)}


# -- inference: a batch as the loader makes it, from the values of an Arrow batch ---------------------------
def _torch_dtype(values: np.ndarray):
    import torch

    # What the loader gives (spark_dist.data.read.arrays.default_dtype): float32 features, int64 integers.
    return {"f": torch.float32, "i": torch.int64, "u": torch.int64, "b": torch.bool}[values.dtype.kind]


def _dense(value) -> np.ndarray:
    """One row of an array or nested array column (numpy object arrays of arrays, or lists) as one array."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value
    if value is None:
        raise ValueError("a null array")
    rows = list(value)  # an object array's items are Python numbers or arrays: numpy infers their dtype again
    return np.stack([_dense(v) for v in rows]) if rows and not np.isscalar(rows[0]) else np.asarray(rows)


def _numbers(values: Sequence) -> Any:
    import torch

    rows = [_dense(v) for v in values]
    if not rows:
        return torch.zeros(0)
    array = np.stack(rows)
    return torch.from_numpy(np.ascontiguousarray(array)).to(_torch_dtype(array))


def _padded(column: str, values: Sequence) -> Dict[str, Any]:
    import torch

    rows = [_dense(v) for v in values]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    typed = [r for r in rows if len(r)] or rows  # an empty row's dtype may be numpy's default, not the column's
    dtype = np.result_type(*typed) if typed else np.dtype(np.float32)
    padded = np.zeros((len(rows), int(lengths.max()) if len(rows) else 0), dtype=dtype)
    for i, row in enumerate(rows):
        padded[i, :len(row)] = row
    return {column: torch.from_numpy(padded).to(_torch_dtype(padded)), f"{column}_lengths": torch.from_numpy(lengths)}


def batch_of(columns: Dict[str, Sequence], kinds: Dict[str, str]) -> Dict[str, Any]:
    """The batch the loader would give of these rows: ``columns`` maps each column to its values in row order
    (a list, a numpy array, a pandas Series' ``to_numpy()``), ``kinds`` each column to its kind; an ML vector's
    values come as arrays (``vector_to_array``).

    Raises:
        ValueError: a null binary, string or array value, naming the column (training refuses nulls, so the
            model never met one).
    """
    import torch

    batch: Dict[str, Any] = {}
    for name, values in columns.items():
        kind = kinds[name]
        if kind != SCALAR and any(v is None for v in values):
            raise ValueError(f"featuresCol: column {name!r} holds null values; fill or drop them before transform")
        if kind == BINARY:
            batch[name] = [bytes(v) for v in values]
        elif kind == STRING:
            batch[name] = [str(v) for v in values]
        elif kind == SCALAR:
            array = np.asarray(values)
            batch[name] = torch.from_numpy(np.ascontiguousarray(array)).to(_torch_dtype(array))
        elif kind == SEQUENCE:
            batch.update(_padded(name, values))
        else:  # ARRAY, VECTOR, NESTED: one shape per row
            batch[name] = _numbers(values)
    return batch


def slice_rows(batch: Dict[str, Any], start: int, stop: int) -> Dict[str, Any]:
    """Rows ``[start, stop)`` of a batch (tensors and lists alike)."""
    return {k: v[start:stop] for k, v in batch.items()}


def rows_in(batch: Dict[str, Any]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def predict_rows(module, fn, batch: Dict[str, Any], chunk: int) -> np.ndarray:
    """The model's outputs on ``fn`` of each ``chunk`` rows of ``batch``, as a ``[rows, outputs]`` float64 array.

    Raises:
        TypeError: ``fn`` returned something that is not a model input, or the model no tensor.
    """
    import torch

    n = rows_in(batch)
    if n == 0:
        return np.zeros((0, 0))
    device = next(module.parameters(), torch.empty(0)).device
    parts: List[np.ndarray] = []
    for start in range(0, n, chunk):
        inputs = to_device(fn(slice_rows(batch, start, min(n, start + chunk))), device)
        with torch.inference_mode():
            out = forward(module, inputs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the model returned a {type(out).__name__} on what the transform gave; it must return "
                            "a [batch] or [batch, outputs] tensor")
        parts.append(out.reshape(out.shape[0], -1).double().cpu().numpy())
    return np.concatenate(parts)
