"""spark_dist: distributed PyTorch training on Apache Spark (DDP, Horovod or DeepSpeed) with Petastorm loaders."""
from .data.prepare import petastorm_compat

petastorm_compat.install()  # before anything imports Petastorm: it needs names new pyarrow and numpy removed

from .task.context import TrainContext, get_context, log_to_driver  # noqa: E402
from .errors import (ClusterConfigError, ConfigError, RankFailure, RunResized, RunTimeoutError,  # noqa: E402
                     TrainingFailedError)
from .driver.distributor import Distributor  # noqa: E402
from .dropins import DeepspeedTorchDistributor, HorovodRunner, TorchDistributor, distributed  # noqa: E402

__all__ = [
    "Distributor", "TorchDistributor", "DeepspeedTorchDistributor", "HorovodRunner", "distributed",
    "predict_batch_udf",
    "get_context", "TrainContext", "log_to_driver", "TrainingFailedError", "RunTimeoutError", "ConfigError",
    "ClusterConfigError", "RankFailure", "RunResized",
]
__version__ = "0.1.0"


def __getattr__(name):
    # predict_batch_udf on first use: it imports pandas and pyspark.sql, which a rank importing spark_dist
    # does not need.
    if name == "predict_batch_udf":
        from .inference import predict_batch_udf

        return predict_batch_udf
    if name == "tune":  # spark_dist.tune.optimize: imports Optuna, which only a study needs
        import importlib

        return importlib.import_module(".tune", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
