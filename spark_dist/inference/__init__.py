"""Batch inference over DataFrames with a model trained anywhere: :func:`predict_batch_udf`, PySpark's
``pyspark.ml.functions.predict_batch_udf`` (same signature, inputs, returns and error messages) with more input
kinds and a bounded per-worker model cache (docs/inference.md says what differs).

``udf`` builds the UDF on the driver; ``worker`` runs in the Python worker: ``batches`` turns each Arrow batch
into the predict function's numpy inputs, ``results`` its outputs into what Spark reads back, ``cache`` keeps
the loaded predict functions between tasks. The UDF module (pandas, ``pyspark.sql``) is imported on first use.
"""
import importlib

__all__ = ["predict_batch_udf"]


def __getattr__(name):
    if name == "predict_batch_udf":
        return importlib.import_module(".udf", __name__).predict_batch_udf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
