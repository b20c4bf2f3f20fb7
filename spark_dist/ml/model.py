"""``TorchModel``: the fitted Spark ML Model; ``transform`` is vectorised batch inference.

Inference is :func:`spark_dist.predict_batch_udf`'s machinery: each Python worker unpickles the module once
(the inference cache, keyed by the weights' digest and the task's device, so reused workers and later
transforms skip even that) and runs one forward pass per chunk of rows, never per row.
"""
import hashlib
import inspect
from typing import Any, Callable, Dict, List, Optional

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Model

from ..errors import ConfigError
from . import inputs, transform_inputs, transforms
from .params import TorchParams
from .persistence import TorchPersistence, dumps, loads

CHUNK_ROWS = 4096  # rows per forward pass at least (batchSize when larger): bounds activation memory

CLASSIFY, BINARY, REGRESS, VECTOR_OUT = "classify", "binary", "regress", "vector"


def inference_device(use_gpu: bool):
    """Where this Spark task predicts: the GPU Spark assigned to it (``spark.task.resource.gpu.amount``),
    the current CUDA device when the task has none assigned, or the CPU."""
    import torch

    if not (use_gpu and torch.cuda.is_available()):
        return torch.device("cpu")
    from pyspark import TaskContext

    from ..spark.resources import cuda_ordinal, task_gpu_addresses

    task = TaskContext.get()
    gpus = task_gpu_addresses(task) if task is not None else []
    return torch.device("cuda", cuda_ordinal(gpus[0]) if gpus else torch.cuda.current_device())


def load_for_inference(payload: bytes, use_gpu: bool):
    """The pickled module on this task's device, in eval mode (or, for a payload of ``{"model", "transform"}``,
    that dict with its module so)."""
    device = inference_device(use_gpu)
    objects = loads(payload)
    if isinstance(objects, dict):
        objects["model"] = objects["model"].to(device).eval()
    else:
        objects = objects.to(device).eval()
    return objects


def output_kind(loss, outputs: int) -> str:
    if loss == "cross_entropy":
        return CLASSIFY
    if outputs == 1:
        return BINARY if loss == "bce_with_logits" else REGRESS
    return VECTOR_OUT


def forward_rows(module, x) -> "np.ndarray":
    """The model's outputs for feature rows ``x`` (a ``[rows, width]`` array, or an object array of per-row
    arrays), as a ``[rows, outputs]`` float64 array; on a GPU the rows go over from pinned memory."""
    import torch

    if len(x) == 0:
        return np.zeros((0, 0))
    if x.dtype == np.object_:
        x = np.stack(x)
    device = next(module.parameters(), torch.empty(0)).device
    rows = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if device.type == "cuda":
        rows = rows.pin_memory().to(device, non_blocking=True)
    with torch.inference_mode():
        out = module(rows)
        return out.reshape(out.shape[0], -1).double().cpu().numpy()


def _taking(fn: Callable, inputs: int) -> Callable:
    """``fn`` as a predict function of ``inputs`` parameters (``predict_batch_udf`` counts them: one array per
    feature column)."""
    def predict(*arrays):
        return fn(*arrays)

    predict.__signature__ = inspect.Signature(
        [inspect.Parameter(f"column{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(inputs)])
    return predict


def make_predict_udf(key: str, payload: bytes, kind: str, use_gpu: bool, chunk: int,
                     kinds: Optional[Dict[str, str]] = None, width: Optional[int] = None):
    """The UDF for one model, made by :mod:`spark_dist.inference` (``predict_batch_udf``'s machinery: Arrow to
    numpy without pandas where PySpark allows, the next batch read while the model runs, the worker's model
    cache, keyed by ``key`` and the task's device). ``payload`` travels inside the pickled UDF (PySpark
    broadcasts it itself once it is large). Without ``kinds`` it takes one ``array<float>`` column of ``width``
    values (``None``: unknown); with ``kinds`` (column -> kind, in the UDF's argument order) one argument per
    feature column, and ``payload`` holds ``{"model", "transform"}``: each ``chunk`` rows become the loader's
    batch, then the transform and the model run on it."""
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    from ..inference.udf import udf_of
    from ..inference.worker import UdfSpec

    names = list(kinds or ())

    def make_predict_fn():
        objects = load_for_inference(payload, use_gpu)

        def outputs(*columns):
            if kinds is None:
                return forward_rows(objects, columns[0])
            batch = transforms.batch_of(dict(zip(names, columns)), kinds)
            return transforms.predict_rows(objects["model"], objects["transform"], batch, chunk)

        def predict(*columns):
            out = outputs(*columns)
            if kind == REGRESS:
                return out[:, 0] if len(out) else np.zeros(0)
            if kind == VECTOR_OUT:
                return out
            if kind == BINARY:  # Spark's binary convention: rawPrediction = [-margin, margin]
                out = np.concatenate([-out, out], axis=1)
            return {"prediction": out.argmax(axis=1).astype("float64"), "raw": out}
        return _taking(predict, max(1, len(names)))

    if kind in (CLASSIFY, BINARY):
        returns = StructType([StructField("prediction", DoubleType()), StructField("raw", ArrayType(DoubleType()))])
    else:
        returns = DoubleType() if kind == REGRESS else ArrayType(DoubleType())
    # Transform inputs reach the transform as the loader gives them (rows as they are); plain features stacked.
    shapes = [None] * len(names) if kinds else [None if width is None else [width]]
    return udf_of(UdfSpec(make_predict_fn, returns, chunk, shapes, key,
                          key_suffix=lambda: f"@{inference_device(use_gpu)}"))


class TorchModel(Model, TorchParams, TorchPersistence):
    """A trained torch module as a Spark ML Model (made by :meth:`TorchEstimator.fit`, or directly around a
    trained module: ``TorchModel(model=module, featuresCol=..., loss="mse")``).

    ``transform(df)`` reads the same ``featuresCol`` as training (vector, array, or list of numeric columns; or,
    with ``transformFn`` / ``inferenceTransformFn`` set, any columns those take: each Arrow batch becomes the
    batch the loader gives, and ``inferenceTransformFn`` (else ``transformFn``) and the module run on
    ``batchSize`` rows of it at a time) and adds, by ``loss``:

    - ``cross_entropy``: ``predictionCol`` (the arg-max class, double) and ``rawPredictionCol`` (the
      outputs, an ML vector), as Spark's classifiers do;
    - ``bce_with_logits`` with one output: ``predictionCol`` (1.0 when the logit is > 0) and
      ``rawPredictionCol`` = ``[-logit, logit]`` (Spark's binary convention);
    - ``mse`` or a callable loss, one output: ``predictionCol`` (double); several outputs: an ML vector.

    ``history`` lists the per-epoch metrics of training (``epoch``, ``train_loss``, ``learning_rate``, and
    ``val_loss`` / ``val_accuracy`` with validation); ``trainingPath()`` how the ranks trained (DDP, or replicas
    without DDP for a small CPU model; the gradient averaging; the optimizer).

    ``transform`` works on streaming DataFrames too. There, a model made around a module (not by ``fit``)
    whose loss is not ``cross_entropy`` must know its number of outputs first: from a feature width the schema
    tells, or from one ``transform`` of a batch DataFrame (which asks the module on its first rows).

    Raises (from ``transform``, before any job but that one): :class:`spark_dist.ConfigError` when ``model`` is
    not set, a feature column is missing or not numeric (without a transform), an output column already exists,
    the number of outputs cannot be known on a stream, or the transform or module fails on the first rows. A
    null feature value, or a transform failing on a later batch, fails the Spark task that meets it.
    """

    @keyword_only
    def __init__(self, *, model=None, featuresCol="features", predictionCol="prediction",
                 rawPredictionCol="rawPrediction", loss="cross_entropy", useGpu=False, batchSize=32,
                 transformFn=None, inferenceTransformFn=None):
        super().__init__()
        self._history: List[Dict[str, Any]] = []
        self._num_features: Optional[int] = None
        self._num_outputs: Optional[int] = None
        self._feature_kinds: Dict[str, str] = {}  # a transform's columns, as the fit's cache measured them
        self._training_path: Dict[str, str] = {}
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def setModel(self, value):
        self._num_outputs = None  # another module: ask it again
        return self._set(model=value)

    def history_frame(self):
        """:attr:`history` as a pandas DataFrame, one row per epoch, ready to plot."""
        from ..driver.summary import history_frame

        return history_frame(self._history)

    @property
    def history(self) -> List[Dict[str, Any]]:
        """One record per training epoch (empty for a model not made by ``fit``)."""
        return list(self._history)

    def numFeatures(self) -> Optional[int]:
        """Values per row of ``featuresCol`` the model was trained on (``None`` when not known)."""
        return self._num_features

    def numOutputs(self) -> Optional[int]:
        return self._num_outputs

    def trainingPath(self) -> Dict[str, str]:
        """How ``fit`` trained: ``{"ranks": "replicas" | "ddp" | "horovod", "gradients": ..., "optimizer": ...}``
        (empty for a model not made by ``fit``)."""
        return dict(self._training_path)

    # -- persistence --------------------------------------------------------------------------------------
    def _extra_metadata(self) -> Dict[str, Any]:
        return {"history": self._history, "numFeatures": self._num_features, "numOutputs": self._num_outputs,
                "trainingPath": self._training_path, "featureKinds": self._feature_kinds}

    def _load_extra_metadata(self, metadata: Dict[str, Any]) -> None:
        self._history = list(metadata.get("history") or [])
        self._num_features = metadata.get("numFeatures")
        self._num_outputs = metadata.get("numOutputs")
        self._training_path = dict(metadata.get("trainingPath") or {})
        self._feature_kinds = dict(metadata.get("featureKinds") or {})

    # -- transform ----------------------------------------------------------------------------------------
    def _outputs(self, dataset, module, features, fn, kinds) -> Optional[int]:
        """The model's outputs per row, where ``transform`` needs them (``None`` where it does not, for
        ``cross_entropy`` on a stream); asked of the module, on the first rows when nothing else tells."""
        if self._num_outputs is not None and (features.width is None or features.width == self._num_features):
            return self._num_outputs
        width = features.width or self._num_features
        if width is None and dataset.isStreaming:  # no row to look at before the query starts
            if self.getLoss() == "cross_entropy":
                return None  # one class per output, however many: the UDF's type does not depend on it
            raise ConfigError(f"loss={self.getLoss()!r} on a streaming DataFrame: the model's number of outputs is "
                              "not known (a model from fit, or featuresCol with a known width, tells it): "
                              "transform a batch DataFrame first, or use a model from TorchEstimator.fit")
        if fn is not None:
            param = "inferenceTransformFn" if self.isSet(self.inferenceTransformFn) else "transformFn"
            sampled = transform_inputs.sample(dataset, features, kinds)
            outputs = transform_inputs.sample_outputs(module, fn, sampled, kinds, param)
            if outputs is not None:  # kept (until setModel): a stream's transform can use it
                self._num_outputs = outputs
            return outputs or 1
        if width is None:  # a model made around a module, on a vector/array column without size metadata
            names = dataset.columns
            row = inputs.by_position(dataset).select(features.width_column(names)).first()
            if row is None:
                return 1
            width = int(row[0])
        return inputs.model_outputs(module, width)

    def _transform(self, dataset):
        from pyspark.ml.functions import array_to_vector

        module = self.getModel()
        if module is None:
            raise ConfigError("model is not set: TorchModel(model=<torch.nn.Module>) or setModel")
        fn = self.getInferenceTransformFn()
        kinds = None
        if fn is None:
            features = inputs.features_of(dataset.schema, self.featureColumns())
        else:
            features = transform_inputs.features_for_transform(dataset.schema, self.featureColumns())
            kinds = transform_inputs.schema_kinds(dataset.schema, features.columns, self._feature_kinds)
        kind = output_kind(self.getLoss(), self._outputs(dataset, module, features, fn, kinds))
        prediction, raw = self.getPredictionCol(), self.getRawPredictionCol()
        added = [("predictionCol", prediction)] + ([("rawPredictionCol", raw)] if kind in (CLASSIFY, BINARY) else [])
        for param, name in added:
            if name in dataset.columns:
                raise ConfigError(f"{param}: the DataFrame already has a column {name!r}; choose another name")
        payload = dumps(module if fn is None else {"model": module, "transform": fn})
        key = hashlib.sha256(payload).hexdigest()
        # A transform's output may be large per row (decoded images): batchSize rows at a time, as in training.
        chunk = self.getBatchSize() if fn is not None else max(CHUNK_ROWS, self.getBatchSize())
        width = features.width or self._num_features if fn is None else None
        udf = make_predict_udf(key, payload, kind, self.getUseGpu(), chunk, kinds, width)
        # SQL text over the columns by position, renamed back after (spark_dist.data.schema.sql, by_position).
        names = dataset.columns
        if fn is None:
            scores = udf(features.array_column(names))
        else:
            scores = udf(*transform_inputs.udf_columns(features, names, kinds))
        # The new columns, named by the positions after the user's until renamed.
        scores_at, raw_at, prediction_at = (inputs.position(len(names) + i) for i in range(3))
        if kind in (REGRESS, VECTOR_OUT):
            return (inputs.by_position(dataset)
                    .withColumn(scores_at, scores if kind == REGRESS else array_to_vector(scores))
                    .toDF(*names, prediction))
        # One UDF column, then its fields: Spark keeps the UDF in its own projection (it is not cheap to
        # repeat), so it runs once per row.
        return (inputs.by_position(dataset).withColumn(scores_at, scores)
                .withColumn(raw_at, array_to_vector(inputs.sql(f"{scores_at}.raw")))
                .withColumn(prediction_at, inputs.sql(f"{scores_at}.prediction"))
                .drop(scores_at).toDF(*names, raw, prediction))
