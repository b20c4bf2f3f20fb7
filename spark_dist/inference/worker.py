"""The UDF's body in the Python worker: the cached predict function over each Arrow batch, ``batch_size`` rows
at a time, PySpark's dispatch (one input per column, or one input for all) and its error messages."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import batches, cache, results

TENSORS_HINT = (" (spark_dist: give None as a column's shape, in a list or by leaving it out of a dict, to pass "
                "its rows as they are: one numpy array per row, of any length)")


@dataclass
class UdfSpec:
    """What the UDF carries to the workers (pickled with it)."""
    make_predict_fn: Callable[[], Callable]
    return_type: Any  # a DataType once the UDF is made
    batch_size: int
    input_tensor_shapes: Any
    key: str  # one per predict_batch_udf call: the model cache's key


def expected_inputs(predict_fn: Callable) -> int:
    """How many arrays the predict function takes: its parameters, as PySpark counts them."""
    return len(inspect.signature(predict_fn).parameters)


def predict_batches(spec: UdfSpec, data: Iterator[Any]) -> Iterator[Any]:
    """The UDF's output for each Arrow batch of its input (a Series, a DataFrame for a struct argument, or a
    tuple of them for several arguments), one pandas object per ``batch_size`` rows.

    Raises:
        ValueError: the inputs do not fit the predict function or ``input_tensor_shapes``, or its output does
            not fit ``return_type`` (PySpark's messages).
    """
    predict_fn = cache.get_or_load(spec.key, spec.make_predict_fn)
    expected = expected_inputs(predict_fn)
    shapes = batches.dense_shapes(spec.input_tensor_shapes, expected)
    size = spec.batch_size
    for data_batch in data:
        batch = batches.ArrowBatch(data_batch)
        if batch.rows == 0:  # nothing to predict (PySpark fails on an empty batch)
            continue
        if batch.has_tensors and not shapes:
            raise ValueError(batches.TENSORS_NEED_SHAPES + TENSORS_HINT)
        columns = len(batch.columns)
        for start in range(0, batch.rows, size):
            stop = min(start + size, batch.rows)
            if columns == expected and expected > 1:
                preds = predict_fn(*batch.multiple(start, stop, shapes))
            elif expected == 1:
                preds = predict_fn(batch.single(start, stop, shapes))
            else:
                raise ValueError(f"Model expected {expected} inputs, but received {columns} columns")
            yield results.to_pandas(preds, stop - start, spec.return_type)
