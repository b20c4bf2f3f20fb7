"""Batch inference over DataFrames with a model trained anywhere: :func:`predict_batch_udf`, PySpark's
``pyspark.ml.functions.predict_batch_udf`` (same signature, inputs, returns and error messages) with more input
kinds and a bounded per-worker model cache (docs/inference.md says what differs).

``udf`` builds the UDF on the driver; ``worker`` runs in the Python worker: ``batches`` turns each Arrow batch
into the predict function's numpy inputs, ``results`` its outputs into what Spark reads back, ``cache`` keeps
the loaded predict functions between tasks. ``models`` loads a model inside ``make_predict_fn`` (a checkpoint,
a pickled module, a ``transformers`` directory, an MLflow model). Each is imported on first use (the UDF's:
pandas, ``pyspark.sql``; the loaders': torch and the library they read).
"""
import importlib

__all__ = ["predict_batch_udf", "load_from_checkpoint", "load_mlflow_model", "load_pickled_module", "load_pretrained",
           "read_checkpoint"]
_MODULES = {"predict_batch_udf": ".udf", **{name: ".models" for name in __all__[1:]}}


def __getattr__(name):
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
