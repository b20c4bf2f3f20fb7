"""The Params that :class:`TorchEstimator` and :class:`TorchModel` share, in Spark ML's camelCase.

Shared names come from ``pyspark.ml.param.shared`` (``labelCol``, ``predictionCol``, ``rawPredictionCol``,
``seed``); ``featuresCol`` is redefined on top of ``HasFeaturesCol`` because it also takes a list of numeric
columns. Each type converter raises ``TypeError`` for a value of the wrong type (Spark prefixes the Param's
name) and :class:`spark_dist.ConfigError` for a value out of range, naming the Param.

``transformFn`` and ``inferenceTransformFn`` turn columns a model cannot take as they are (``binary`` images,
``string`` text, token sequences of varying length) into tensors; their contract is
:mod:`spark_dist.ml.transforms`'. (Not ``transform``: that is the Model's method, and Params are attributes.)
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, List, Union

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol, HasLabelCol, HasPredictionCol, HasRawPredictionCol, HasSeed,
)

from ..config import BACKENDS
from ..errors import ConfigError

LOSSES = ("cross_entropy", "mse", "bce_with_logits")
OPTIMIZERS = ("adam", "sgd", "adamw")

# Params whose values are Python objects rather than JSON: persistence keeps them in a file of their own.
OBJECT_PARAMS = ("model", "loss", "optimizer", "transformFn", "inferenceTransformFn")


# -- type converters (module-level: Params are copied, never pickled, but keep them importable) -----------
def _to_module(value):
    import torch

    if not isinstance(value, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(value).__name__}")
    return value


def _choice_or_callable(name: str, choices) -> Callable[[Any], Any]:
    def convert(value):
        if callable(value):
            return value
        if not isinstance(value, str):
            raise TypeError(f"{name} must be one of {', '.join(choices)} or a callable, got {type(value).__name__}")
        text = value.strip().lower().replace("-", "_")
        if text not in choices:
            raise ConfigError(f"{name}={value!r}: choose one of {', '.join(choices)}, or pass a callable")
        return text
    convert.__name__ = f"_to_{name}"
    return convert


_to_loss = _choice_or_callable("loss", LOSSES)
_to_optimizer = _choice_or_callable("optimizer", OPTIMIZERS)


def _to_function(value):
    if not callable(value):  # Spark's message names the Param
        raise TypeError(f"need a callable (a batch dict -> the model's input), got {type(value).__name__}")
    return value


def _to_backend(value):
    text = TypeConverters.toString(value).strip().lower()
    if text not in BACKENDS:
        raise ConfigError(f"backend={value!r}: choose 'ddp' or 'horovod'")
    return text


def _to_columns(value) -> Union[str, List[str]]:
    """One column name, or a non-empty list of them (numeric columns stacked into one feature vector)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        if len(set(value)) != len(value):
            raise ConfigError(f"featuresCol={list(value)!r} names a column twice")
        return list(value)
    raise TypeError("featuresCol must be a column name or a non-empty list of column names, "
                    f"got {value!r}")


def _int_at_least(name: str, least: int = 1, why: str = ""):
    def convert(value):
        number = TypeConverters.toInt(value)
        if number < least:
            raise ConfigError(f"{name}={value!r}: must be at least {least}{why}")
        return number
    convert.__name__ = f"_to_{name}"
    return convert


def _to_learning_rate(value):
    number = TypeConverters.toFloat(value)
    if not number > 0:
        raise ConfigError(f"learningRate={value!r}: must be positive")
    return number


def _to_fraction(value):
    number = TypeConverters.toFloat(value)
    if not 0.0 <= number < 1.0:
        raise ConfigError(f"validationFraction={value!r}: must be in [0, 1)")
    return number


def _to_warmup(value):
    number = TypeConverters.toFloat(value)
    if number < 0:
        raise ConfigError(f"warmupEpochs={value!r}: must be >= 0")
    return number


class HasTorchFeaturesCol(HasFeaturesCol):
    """``featuresCol``: an ML vector column, an array-of-numbers column, or a list of numeric columns; with a
    ``transformFn``, one column or a list of columns of any kind the loader takes (binary, string, arrays)."""

    featuresCol: "Param[Union[str, List[str]]]" = Param(
        Params._dummy(), "featuresCol",
        "features: an ML vector or array<number> column, or a list of numeric columns; with a transform, "
        "column(s) of any kind it takes (binary, string, arrays of varying length, ...)",
        typeConverter=_to_columns)


class TorchParams(HasTorchFeaturesCol, HasLabelCol, HasPredictionCol, HasRawPredictionCol, HasSeed):
    """Every Param of the estimator; the model carries the same ones (as Spark's models do)."""

    model: "Param[Any]" = Param(
        Params._dummy(), "model", "the torch.nn.Module to train (its current weights are the starting point)",
        typeConverter=_to_module)
    loss: "Param[Any]" = Param(
        Params._dummy(), "loss",
        "'cross_entropy' (classes 0..C-1), 'mse', 'bce_with_logits', or a callable (output, label) -> loss",
        typeConverter=_to_loss)
    optimizer: "Param[Any]" = Param(
        Params._dummy(), "optimizer", "'adam', 'sgd', 'adamw', or a callable (parameters, lr) -> optimizer",
        typeConverter=_to_optimizer)
    batchSize: "Param[int]" = Param(
        Params._dummy(), "batchSize", "rows per batch on each rank (the global batch is batchSize x numProcesses)",
        typeConverter=_int_at_least("batchSize"))
    epochs: "Param[int]" = Param(Params._dummy(), "epochs", "passes over the training data",
                                 typeConverter=_int_at_least("epochs"))
    learningRate: "Param[float]" = Param(
        Params._dummy(), "learningRate", "learning rate for one process (see scaleLearningRate)",
        typeConverter=_to_learning_rate)
    numProcesses: "Param[int]" = Param(
        Params._dummy(), "numProcesses", "training processes (Spark barrier tasks; one GPU each with useGpu)",
        typeConverter=_int_at_least("numProcesses"))
    backend: "Param[str]" = Param(Params._dummy(), "backend", "'ddp' (PyTorch DDP) or 'horovod'",
                                  typeConverter=_to_backend)
    useGpu: "Param[bool]" = Param(Params._dummy(), "useGpu", "one GPU per process, NCCL for DDP",
                                  typeConverter=TypeConverters.toBoolean)
    validationFraction: "Param[float]" = Param(
        Params._dummy(), "validationFraction",
        "fraction of rows held out (by a hash of each row and seed) for per-epoch validation; 0 for none",
        typeConverter=_to_fraction)
    validationCol: "Param[str]" = Param(
        Params._dummy(), "validationCol", "boolean column: true marks a validation row (instead of a fraction)",
        typeConverter=TypeConverters.toString)
    scaleLearningRate: "Param[bool]" = Param(
        Params._dummy(), "scaleLearningRate",
        "multiply learningRate by the number of processes (Goyal et al. 2017), ramping up over warmupEpochs",
        typeConverter=TypeConverters.toBoolean)
    warmupEpochs: "Param[float]" = Param(
        Params._dummy(), "warmupEpochs", "epochs of the linear warm-up to the scaled learning rate",
        typeConverter=_to_warmup)
    verbose: "Param[bool]" = Param(Params._dummy(), "verbose", "print each epoch's metrics on the driver",
                                   typeConverter=TypeConverters.toBoolean)
    transformFn: "Param[Any]" = Param(
        Params._dummy(), "transformFn",
        "a callable: a batch of the featuresCol columns (dict of column -> list / tensor) -> the model's input "
        "(a tensor, a tuple of tensors, or a dict of tensors); decode, tokenize, augment",
        typeConverter=_to_function)
    inferenceTransformFn: "Param[Any]" = Param(
        Params._dummy(), "inferenceTransformFn",
        "the transform for validation rows and TorchModel.transform (default: transformFn), e.g. without "
        "random augmentation", typeConverter=_to_function)
    transformWorkers: "Param[int]" = Param(
        Params._dummy(), "transformWorkers",
        "worker processes per training process that run transformFn (0: in the loader's thread)",
        typeConverter=_int_at_least("transformWorkers", 0, " (0 runs the transform in the loader's thread)"))
    maxRetries: "Param[int]" = Param(
        Params._dummy(), "maxRetries",
        "retries of the fit after a rank, executor or Python worker was lost, each going on from the last epoch "
        "that ended (a checkpoint at each epoch's end; 0: none)",
        typeConverter=_int_at_least("maxRetries", 0, " (0: the fit fails with its first lost rank)"))

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # HasSeed's default, hash(class name), changes with PYTHONHASHSEED; a fixed one makes fits repeatable.
        self._setDefault(
            featuresCol="features", loss="cross_entropy", optimizer="adam", batchSize=32, epochs=10,
            learningRate=1e-3, numProcesses=1, backend="ddp", useGpu=False, validationFraction=0.0,
            scaleLearningRate=True, warmupEpochs=1.0, verbose=False, transformWorkers=0, maxRetries=0,
            seed=zlib.crc32(type(self).__name__.encode()))

    # -- getters ------------------------------------------------------------------------------------------
    def getModel(self):
        """The torch module (for a :class:`TorchModel`, with the trained weights); ``None`` if not set."""
        return self.getOrDefault(self.model) if self.isDefined(self.model) else None

    def getLoss(self):
        return self.getOrDefault(self.loss)

    def getOptimizer(self):
        return self.getOrDefault(self.optimizer)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

    def getNumProcesses(self) -> int:
        return self.getOrDefault(self.numProcesses)

    def getBackend(self) -> str:
        return self.getOrDefault(self.backend)

    def getUseGpu(self) -> bool:
        return self.getOrDefault(self.useGpu)

    def getValidationFraction(self) -> float:
        return self.getOrDefault(self.validationFraction)

    def getValidationCol(self):
        return self.getOrDefault(self.validationCol) if self.isDefined(self.validationCol) else None

    def getScaleLearningRate(self) -> bool:
        return self.getOrDefault(self.scaleLearningRate)

    def getWarmupEpochs(self) -> float:
        return self.getOrDefault(self.warmupEpochs)

    def getVerbose(self) -> bool:
        return self.getOrDefault(self.verbose)

    def getTransformFn(self):
        """The ``transformFn`` callable; ``None`` if not set."""
        return self.getOrDefault(self.transformFn) if self.isDefined(self.transformFn) else None

    def getInferenceTransformFn(self):
        """The transform of validation rows and of :meth:`TorchModel.transform`: ``inferenceTransformFn`` when
        set, else ``transformFn`` (``None`` when neither is)."""
        if self.isDefined(self.inferenceTransformFn):
            return self.getOrDefault(self.inferenceTransformFn)
        return self.getTransformFn()

    def getTransformWorkers(self) -> int:
        return self.getOrDefault(self.transformWorkers)

    def getMaxRetries(self) -> int:
        return self.getOrDefault(self.maxRetries)

    def featureColumns(self) -> List[str]:
        """``featuresCol`` as a list of column names."""
        value = self.getFeaturesCol()
        return [value] if isinstance(value, str) else list(value)

    # -- setters shared by the estimator and the model ----------------------------------------------------
    def setFeaturesCol(self, value):
        return self._set(featuresCol=value)

    def setLabelCol(self, value: str):
        return self._set(labelCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setRawPredictionCol(self, value: str):
        return self._set(rawPredictionCol=value)

    def setUseGpu(self, value: bool):
        return self._set(useGpu=value)

    def setTransformFn(self, value):
        return self._set(transformFn=value)

    def setInferenceTransformFn(self, value):
        return self._set(inferenceTransformFn=value)

    def setTransformWorkers(self, value: int):
        return self._set(transformWorkers=value)

    def setMaxRetries(self, value: int):
        return self._set(maxRetries=value)


__all__ = ["TorchParams", "HasTorchFeaturesCol", "LOSSES", "OPTIMIZERS", "BACKENDS", "OBJECT_PARAMS"]
