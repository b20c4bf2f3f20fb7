"""The driver's side of the ``transform`` Param: which columns a transform may take, the Columns the inference
UDF reads, and one look at the first rows, so that a transform or a model that cannot meet the data fails
before any training job with a :class:`spark_dist.ConfigError` naming the Param.

Column kinds are the loader's (:func:`spark_dist.data.schema.loader_kind`): numbers, arrays and nested arrays of
numbers, ML vectors, ``binary``, ``string``. An ``array<number>`` column is ``"array"`` (``[rows, length]``)
once a fit's cache write measured one length in every row, else ``"sequence"`` (padded, with its lengths): a
model that did not come from ``fit`` does not know, so its transform gets such a column padded (the same tensor
when the rows agree in length, and the lengths beside it).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..data.schema import ARRAY, SEQUENCE, VECTOR, loader_kind, position, sql
from ..errors import ConfigError
from . import transforms
from .inputs import TRANSFORMED, Features

SAMPLE_ROWS = 2


def features_for_transform(schema, columns: List[str]) -> Features:
    """``featuresCol`` read for a transform: one column or several, each of a kind the loader takes.

    Raises:
        ConfigError: a missing column, or one of a type the loader cannot take (map, struct, ...), naming it.
    """
    from ..data.schema import _refusal_hint

    for column in columns:
        if column not in schema.names:
            raise ConfigError(f"featuresCol: the DataFrame has no column {column!r}; its columns are: "
                              f"{', '.join(schema.names)}")
        t = schema[column].dataType
        if loader_kind(t) is None:
            raise ConfigError(f"featuresCol: column {column!r} has type {t.simpleString()}, which no transform can "
                              "be given (supported: numbers, arrays and nested arrays of numbers, ML vectors, "
                              f"binary, string); {_refusal_hint(column, t)}")
    return Features(tuple(columns), False, None, TRANSFORMED)


def schema_kinds(schema, columns, fitted: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Each column's kind as the transform will see it: the kind the fit's cache recorded (``fitted``) where it
    is known and the schema still agrees, else the schema's, an array of numbers taken as a sequence."""
    kinds = {}
    for column in columns:
        kind = loader_kind(schema[column].dataType)
        known = (fitted or {}).get(column)
        if kind == ARRAY:
            kind = known if known in (ARRAY, SEQUENCE) else SEQUENCE
        kinds[column] = kind
    return kinds


def udf_columns(features: Features, names: List[str], kinds: Dict[str, str]) -> list:
    """The Columns of ``by_position(df)`` (``names``: ``df.columns``) that the inference UDF reads, in
    ``featuresCol``'s order: ML vectors as arrays (Arrow has no vector type), the others as they are."""
    from pyspark.ml.functions import vector_to_array

    out = []
    for column in features.columns:
        at = sql(position(names.index(column)))
        out.append(vector_to_array(at, "float32") if kinds[column] == VECTOR else at)
    return out


def sample(dataset, features: Features, kinds: Dict[str, str]) -> Dict[str, list]:
    """The first rows' feature values (one small Spark job), column -> list, as the inference UDF reads them."""
    from .inputs import by_position

    names = dataset.columns
    rows = by_position(dataset).select(*udf_columns(features, names, kinds)).limit(SAMPLE_ROWS).collect()
    return {c: [row[i] for row in rows] for i, c in enumerate(features.columns)}


def has_arrays(schema, columns) -> bool:
    """Whether a column is an array of numbers, whose kind (one length, or a sequence) the cache write measures."""
    return any(loader_kind(schema[c].dataType) == ARRAY for c in columns)


def check_sample(module, fn, inference_fn, values: Dict[str, list], kinds: Dict[str, str]) -> Optional[int]:
    """The model's outputs per row on what ``fn`` and ``inference_fn`` make of the sampled rows.

    Raises:
        ConfigError: as :func:`sample_outputs`, or the two transforms give the model inputs of different widths.
    """
    outputs = sample_outputs(module, fn, values, kinds, "transformFn")
    if inference_fn is not fn:
        other = sample_outputs(module, inference_fn, values, kinds, "inferenceTransformFn")
        if other != outputs:
            raise ConfigError(f"the model gives {outputs} outputs on what transformFn returns and {other} on what "
                              "inferenceTransformFn returns: both must make the same model input")
    return outputs


def sample_outputs(module, fn, values: Dict[str, list], kinds: Dict[str, str], param: str) -> Optional[int]:
    """Outputs per row of ``module`` on ``fn`` of the sampled rows (``None`` when there are none).

    Raises:
        ConfigError: ``fn`` fails on them, returns no model input, or the model cannot take what it returns;
            the message names ``param`` (``transformFn`` or ``inferenceTransformFn``).
    """
    import torch

    if not values or not next(iter(values.values())):
        return None
    batch = transforms.batch_of(values, kinds)
    try:
        inputs = fn(batch)
    except Exception as exc:
        raise ConfigError(f"{param} failed on the first {transforms.rows_in(batch)} rows of the DataFrame "
                          f"(given {describe(batch)}): {type(exc).__name__}: {exc}") from exc
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = transforms.forward(module, inputs)
    except Exception as exc:  # any error here means the model and the transform disagree
        raise ConfigError(f"model cannot take what {param} returns ({describe(inputs)}): "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        module.train(was_training)
    rows = transforms.rows_in(batch)
    if not isinstance(out, torch.Tensor) or out.dim() not in (1, 2) or out.shape[0] != rows:
        raise ConfigError(f"model must return a [batch] or [batch, outputs] tensor; on what {param} made of "
                          f"{rows} rows it returned {getattr(out, 'shape', type(out).__name__)}")
    return 1 if out.dim() == 1 else int(out.shape[1])


def describe(value) -> str:
    """A short account of a batch or of a transform's result: types and shapes, never the values."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = type(value[0]).__name__ if value else ""
        if value and isinstance(value[0], torch.Tensor):
            return f"{type(value).__name__} of {len(value)} tensors"
        return f"{type(value).__name__} of {len(value)} {inner}"
    return type(value).__name__


def check_params(est) -> Tuple[Optional[object], Optional[object]]:
    """``(transformFn, inferenceTransformFn)`` of an estimator, or ``(None, None)``.

    Raises:
        ConfigError: ``inferenceTransformFn`` or ``transformWorkers`` without a ``transformFn``.
    """
    fn = est.getTransformFn()
    if fn is None:
        if est.isSet(est.inferenceTransformFn):
            raise ConfigError("inferenceTransformFn is set but transformFn is not: set transformFn (the function "
                              "for the training rows) too")
        if est.getTransformWorkers() > 0:
            raise ConfigError(f"transformWorkers={est.getTransformWorkers()} has no transform to run: set "
                              "transformFn, or leave transformWorkers at 0")
        return None, None
    return fn, est.getInferenceTransformFn()
