"""Spark ML stages for torch: :class:`TorchEstimator` (fit through spark_dist's Distributor) and
:class:`TorchModel` (vectorised batch inference), at home in ``Pipeline``, ``CrossValidator`` and
``TrainValidationSplit``, saved and loaded like any Spark ML stage."""
from .estimator import TorchEstimator
from .model import TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
