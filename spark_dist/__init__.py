"""spark_dist: distributed PyTorch training on Apache Spark (DDP or Horovod) with Petastorm loaders."""
from .context import TrainContext, get_context
from .errors import ConfigError, RankFailure, RunTimeoutError, TrainingFailedError
from .launcher import Distributor
from .dropins import HorovodRunner, TorchDistributor

__all__ = [
    "Distributor", "TorchDistributor", "HorovodRunner", "get_context", "TrainContext",
    "TrainingFailedError", "RunTimeoutError", "ConfigError", "RankFailure",
]
__version__ = "0.1.0"
