"""Spark ML stages for torch: :class:`TorchEstimator` (fit through spark_dist's Distributor) and
:class:`TorchModel` (vectorised batch inference), at home in ``Pipeline``, ``CrossValidator`` and
``TrainValidationSplit``, saved and loaded like any Spark ML stage.

The stages are imported on first use: each rank imports :mod:`spark_dist.ml.training` from this package, and
must not pay for importing ``pyspark.ml`` and pandas there, on every fit's first run."""
import importlib

__all__ = ["TorchEstimator", "TorchModel"]
_WHERE = {"TorchEstimator": ".estimator", "TorchModel": ".model"}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
