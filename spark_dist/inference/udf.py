"""``predict_batch_udf``: PySpark's ``pyspark.ml.functions.predict_batch_udf`` (>= 3.4), one import away.

Built the same way, as a scalar-iterator pandas UDF, so Spark moves the same data the same way, on classic and
Spark Connect sessions alike; the body (:mod:`.worker`) is ours.
"""
from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator, List, Mapping, Optional, Union

import pandas as pd

from ..errors import ConfigError
from .worker import UdfSpec, predict_batches


def predict_batch_udf(
    make_predict_fn: Callable[[], Callable[..., Any]],
    *,
    return_type: Any,
    batch_size: int,
    input_tensor_shapes: Optional[Union[List[Optional[List[int]]], Mapping[int, List[int]]]] = None,
):
    """A pandas UDF that runs ``make_predict_fn()``'s predict function over a DataFrame, ``batch_size`` rows at
    a time: ``pyspark.ml.functions.predict_batch_udf``'s signature, inputs, outputs and error messages.

    ``make_predict_fn()`` loads the model and returns ``predict``, which takes one numpy array per input (its
    parameters are counted) and returns a numpy array, a dict of arrays, or a list of one dict per row. It runs
    once per Python worker: the function is cached in the worker, across tasks, stages and jobs, at most 3 (or
    ``SPARK_DIST_PREDICT_CACHE_SIZE``) per worker, least recently used dropped first (:mod:`.cache`).

    Inputs, for the columns the UDF is called with (PySpark's rules):

    - a numeric column -> a 1-D array; string and binary columns -> a 1-D object array of ``str`` / ``bytes``;
    - an array column -> ``[rows, *shape]`` with its shape in ``input_tensor_shapes`` (a list with one entry
      per input, or ``{index: shape}``; shapes without the batch dimension);
    - several columns and a ``predict`` with as many parameters -> one array each; several scalar columns for a
      one-parameter ``predict`` go in one ``array(...)`` column (or a struct).

    Beyond PySpark: an array column whose shape is ``None`` (a ``None`` in the list, or left out of the dict)
    reaches ``predict`` as it is, a 1-D object array of per-row numpy arrays of any length (variable-length
    sequences, nested arrays), also for a one-parameter ``predict``; ``predict`` may return torch tensors (taken
    to the CPU as numpy) and lists; ``return_type`` may be a DDL string (``"array<float>"``), which PySpark's
    accepts but then fails on in the task.

    Outputs, by ``return_type``: a scalar type (byte, short, int, long, float, double, string) takes a
    ``[rows]`` or ``[rows, 1]`` array; ``ArrayType`` a ``[rows, n]`` array; ``StructType`` a dict of arrays
    keyed by its fields (1-D for scalar fields, 2-D for array fields) or a list of one dict per row.

    Raises:
        ConfigError: ``batch_size`` is not a positive integer (on the driver; PySpark loops forever on 0).
        ValueError: in the task (surfacing as Spark's ``PythonException``), with PySpark's messages: a tensor
            column without ``input_tensor_shapes``, shapes that do not fit the data, a number of columns the
            predict function does not take, an output that does not fit ``return_type``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    # One key per call on the driver: a new UDF loads its model afresh in every worker (as in PySpark).
    return udf_of(UdfSpec(make_predict_fn, return_type, batch_size, input_tensor_shapes, uuid.uuid4().hex))


def udf_of(spec: UdfSpec):
    """The UDF for ``spec``: an Arrow UDF where PySpark has them, else a pandas UDF. ``TorchModel.transform``
    builds its own ``spec`` (its key is the weights' digest, so a later transform finds the model loaded)."""
    if _has_arrow_udfs():
        return _arrow_udf(spec)
    return _pandas_udf(spec)


def _has_arrow_udfs() -> bool:
    """PySpark >= 4.1 has Arrow UDFs: the batches reach the predict function without pandas in between."""
    import pyspark.sql.functions as functions

    return hasattr(functions, "arrow_udf")


def _arrow_udf(spec: UdfSpec):
    """A scalar-iterator Arrow UDF (the function type given, since its type hints cannot say "one array, or a
    tuple of them")."""
    import warnings

    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.pandas.types import to_arrow_type

    holder = {}

    def predict(data: Iterator[Any]) -> Iterator[Any]:
        return predict_batches(spec, data, arrow_type=holder["arrow_type"])

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*type hints for arrow UDF.*")
        udf = arrow_udf(predict, spec.return_type, ArrowUDFType.SCALAR_ITER)
    spec.return_type = udf.returnType  # a DDL string parsed, as the UDF itself parsed it
    holder["arrow_type"] = to_arrow_type(spec.return_type)
    return udf


def _pandas_udf(spec: UdfSpec):
    from pyspark.sql.functions import pandas_udf

    def predict(data: Iterator[Union[pd.Series, pd.DataFrame]]) -> Iterator[pd.DataFrame]:
        return predict_batches(spec, data)

    # The hints (as PySpark's) make it a scalar-iterator pandas UDF; it reads their names from its globals.
    predict.__annotations__ = {"data": Iterator[Union[pd.Series, pd.DataFrame]], "return": Iterator[pd.DataFrame]}
    udf = pandas_udf(predict, spec.return_type)
    spec.return_type = udf.returnType  # a DDL string parsed, as the UDF itself parsed it
    return udf
