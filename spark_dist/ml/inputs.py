"""Driver-side checks of a DataFrame against the Params, before any training job.

Schema checks cost nothing; the label range (and, when the schema does not say it, the feature width) is
measured by the job that writes the dataset cache, so a fit runs one data job before training. Every error is
a :class:`spark_dist.ConfigError` naming the Param and column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

# ARRAY, by_position and quoted are for callers (the estimator and the model).
from ..data.schema import (  # noqa: F401
    ARRAY, SCALAR, VECTOR, by_position, kind_of, loader_kind, position, quoted, sql,
)
from ..errors import ConfigError


def column_kind(schema, column: str, param: str) -> str:
    """``"vector"``, ``"array"`` (of numbers) or ``"scalar"`` (a number).

    Raises:
        ConfigError: no such column, or a column of another type; the message names ``param``.
    """
    from pyspark.sql import types as T

    if column not in schema.names:
        raise ConfigError(f"{param}: the DataFrame has no column {column!r}; its columns are: "
                          f"{', '.join(schema.names)}")
    t = schema[column].dataType
    kind = kind_of(t)
    if kind is not None:
        return kind
    hint = " (index it with StringIndexer)" if isinstance(t, T.StringType) else ""
    if param == "featuresCol" and loader_kind(t) is not None:  # binary, string, nested or ragged arrays
        hint += ("; or set the transformFn Param to a function that turns it into tensors (decode images, "
                 "tokenize text, pad sequences)")
    raise ConfigError(f"{param}: column {column!r} has type {t.simpleString()}, not a number, an array of numbers "
                      f"or an ML vector{hint}")


TRANSFORMED = "transformed"  # Features.kind: columns of any loader kind, turned into tensors by the transform


@dataclass(frozen=True)
class Features:
    """How ``featuresCol`` reads a DataFrame: one vector/array column, or scalar columns stacked in order."""

    columns: Tuple[str, ...]
    stacked: bool                  # scalar columns -> one [batch, len(columns)] tensor
    width: Optional[int]           # values per row, when the schema tells (stacked columns, assembler metadata)
    kind: str                      # VECTOR, ARRAY or SCALAR (stacked); TRANSFORMED (transform_inputs)

    def array_column(self, names: List[str]):
        """The features as one ``array<float>`` Column (for inference) of ``by_position(df)``, where ``names``
        are ``df.columns``."""
        from pyspark.ml.functions import vector_to_array

        at = [position(names.index(c)) for c in self.columns]
        if self.stacked:
            return sql("array(" + ", ".join(f"CAST({c} AS FLOAT)" for c in at) + ")")
        if self.kind == VECTOR:
            return vector_to_array(sql(at[0]), "float32")
        return sql(f"CAST({at[0]} AS ARRAY<FLOAT>)")

    def width_column(self, names: List[str]):
        """The number of feature values in a row (of a vector or array column), as a Column of
        ``by_position(df)``, where ``names`` are ``df.columns``."""
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F

        col = sql(position(names.index(self.columns[0])))
        return F.size(vector_to_array(col) if self.kind == VECTOR else col)


def features_of(schema, columns: List[str]) -> Features:
    """Read ``featuresCol`` against ``schema``.

    Raises:
        ConfigError: a missing column, a non-numeric one, or a list that mixes vectors/arrays in.
    """
    kinds = [column_kind(schema, c, "featuresCol") for c in columns]
    if len(columns) == 1 and kinds[0] != SCALAR:
        width = None
        if kinds[0] == VECTOR:  # VectorAssembler and friends record the size in the column's ML attributes
            width = schema[columns[0]].metadata.get("ml_attr", {}).get("num_attrs")
        return Features(tuple(columns), False, width, kinds[0])
    mixed = [c for c, k in zip(columns, kinds) if k != SCALAR]
    if mixed:
        raise ConfigError(f"featuresCol={columns!r}: column {mixed[0]!r} is a vector or an array; a list may hold "
                          "only numeric columns (or pass that one column alone, or assemble them with VectorAssembler)")
    return Features(tuple(columns), True, len(columns), SCALAR)


def check_label(schema, label: str, loss, features: Features) -> str:
    """The label column's kind; cross_entropy needs a numeric scalar.

    Raises:
        ConfigError: no such column, a non-numeric one, a vector label for cross_entropy, or the label among
            the features.
    """
    kind = column_kind(schema, label, "labelCol")
    if label in features.columns:
        raise ConfigError(f"labelCol {label!r} is also in featuresCol; train on other columns")
    if loss == "cross_entropy" and kind != SCALAR:
        raise ConfigError(f"labelCol {label!r} is a {kind}: loss='cross_entropy' needs one class index per row")
    return kind


_HASH_RANGE = 1 << 53  # hash values are cut to [0, 2**53): every bound there is an exact double


def split_by_content(df, fraction: float, seed: int) -> dict:
    """``{"train": ..., "val": ...}``: ``df``'s rows split by a hash of each row's values and ``seed``, about
    ``fraction`` of them to ``"val"``.

    The two halves are written by two Spark jobs, each reading the source again. A row's half depends on the
    row alone (not on its partition or its place in it, as ``randomSplit``'s does), so every row lands in
    exactly one half even when the source changes between the reads (new files, another partitioning, a
    nondeterministic column); equal rows land in the same half, so no duplicate straddles the two. The same
    seed gives the same split.
    """
    names = df.columns
    positional = by_position(df)
    values = ", ".join([f"CAST({int(seed)} AS BIGINT)", *(position(i) for i in range(len(names)))])
    held_out = f"pmod(xxhash64({values}), {_HASH_RANGE}) < {int(fraction * _HASH_RANGE)}"
    return {"train": positional.filter(f"NOT ({held_out})").toDF(*names),
            "val": positional.filter(held_out).toDF(*names)}


def prepare(spark, datasets: dict, num_processes: int, features: Features, label: str,
            validation: str = "") -> dict:
    """Materialise the fit's DataFrames (one Spark job each, which also measures them) as dataset handles.

    Raises:
        ConfigError: a value the loaders cannot take (nulls, vectors of unequal length, an empty DataFrame,
            fewer rows than processes); the message names the Param of the column (``featuresCol``,
            ``labelCol``) or, for the validation rows, ``validation`` (the Param that made them).
    """
    from ..data import DatasetError, prepare_datasets

    try:
        # The model's input has one width, unless a transform makes it of what it is given.
        fixed = () if features.kind == TRANSFORMED else features.columns
        return prepare_datasets(spark, datasets, num_processes, value_ranges=(label,), fixed_length=fixed)
    except DatasetError as exc:
        if exc.dataset is None:  # the cache's conf (no scheme, not shared across hosts): its key is named
            raise ConfigError(str(exc)) from None
        where = [f"{validation} (the validation rows)"] if exc.dataset == "val" else []
        if exc.column is not None:
            where.insert(0, "labelCol" if exc.column == label else "featuresCol")
        elif "fewer than the" in str(exc):
            where.append(f"numProcesses={num_processes}")
        raise ConfigError(f"{', '.join(where) or 'fit() (the training rows)'}: {exc}") from None


def feature_width(features: Features, handles: dict) -> int:
    """Values per row of ``featuresCol``: from the schema, or as the cache write measured it."""
    if features.width is not None:
        return int(features.width)
    return int(handles["train"].column(features.columns[0]).length)


def model_outputs(module, width: int) -> int:
    """Outputs per row of ``module`` on ``width`` features, from one forward pass of two zero rows.

    Raises:
        ConfigError: the module cannot take ``[batch, width]`` input.
    """
    import torch

    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(2, width))
    except Exception as exc:  # any error here means the model and featuresCol disagree
        raise ConfigError(f"model cannot take a [batch, {width}] float tensor, which featuresCol gives: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        module.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() not in (1, 2) or out.shape[0] != 2:
        raise ConfigError(f"model must return a [batch] or [batch, outputs] tensor; on [2, {width}] input it "
                          f"returned {getattr(out, 'shape', type(out).__name__)}")
    return 1 if out.dim() == 1 else int(out.shape[1])


def check_label_values(label: str, loss, label_kind: str, outputs: int, handles: dict) -> None:
    """Labels fit the loss and the model's outputs, by the range the cache write measured.

    Raises:
        ConfigError: non-integer or out-of-range classes, or bce targets outside [0, 1]; the message
            names ``labelCol``.
    """
    if label_kind != SCALAR or loss not in ("cross_entropy", "bce_with_logits"):
        return
    stats = [h.column(label).stats for h in handles.values()]
    nans = sum(s.nans for s in stats)
    if nans:
        raise ConfigError(f"labelCol {label!r} holds {nans} NaN values; drop or fill them")
    lo, hi = min(s.minimum for s in stats), max(s.maximum for s in stats)
    if loss == "cross_entropy":
        non_integers = sum(s.non_integers for s in stats)
        if non_integers:
            raise ConfigError(f"labelCol {label!r} holds {non_integers} non-integer values; "
                              "loss='cross_entropy' needs class indices 0, 1, ...")
        if outputs < 2:
            raise ConfigError(f"model has {outputs} output; loss='cross_entropy' needs one output per class")
        if lo < 0 or hi >= outputs:
            raise ConfigError(f"labelCol {label!r} holds values from {lo:g} to {hi:g}, but the model has {outputs} "
                              f"outputs: loss='cross_entropy' needs class indices 0..{outputs - 1}")
    elif lo < 0 or hi > 1:
        raise ConfigError(f"labelCol {label!r} holds values from {lo:g} to {hi:g}; loss='bce_with_logits' "
                          "needs targets in [0, 1]")


def check_slots(spark, needed: int, use_gpu: bool) -> None:
    """The cluster can run ``numProcesses`` barrier tasks at once (waiting for executors still registering,
    up to ``spark.dist.slotWaitTimeout``, except on a ``local[N]`` master where nothing more will come).

    Raises:
        ConfigError: too few task slots; the message names ``numProcesses``.
    """
    from ..config import slot_wait_timeout
    from ..driver.distributor import _spark_conf
    from ..spark.resources import wait_for_slots

    try:
        wait_for_slots(spark, needed, slot_wait_timeout(_spark_conf(spark)), use_gpu)
    except ConfigError as exc:
        raise ConfigError(f"numProcesses={needed}: {exc}") from None
