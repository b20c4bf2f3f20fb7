"""Drop-in replacements: moving from PySpark's TorchDistributor or Databricks' HorovodRunner is one
changed import."""
from __future__ import annotations

from typing import Any, Optional

from .errors import ConfigError
from .launcher import Distributor


class TorchDistributor(Distributor):
    """PySpark's ``pyspark.ml.torch.distributor.TorchDistributor``, same arguments and defaults.

    ``run(train_object, *args, **kwargs)`` runs a function (returns rank 0's value) or a ``.py`` path with
    its command-line arguments (returns ``None``), as PySpark's does; underneath it is spark_dist's launcher.

    Raises:
        ConfigError: as :class:`~spark_dist.Distributor`.
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, **options: Any):
        super().__init__(num_processes=num_processes, backend="ddp", local_mode=local_mode, use_gpu=use_gpu,
                         **options)


class HorovodRunner(Distributor):
    """Databricks' ``sparkdl.HorovodRunner``: ``np > 0`` runs np Spark tasks, ``np < 0`` runs -np processes on
    the driver, ``np == 0`` uses every task slot of the cluster. ``run(main, **kwargs)`` returns rank 0's value.

    Raises:
        ConfigError: ``np`` is not an int.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "all", **options: Any):
        if isinstance(np, bool) or not isinstance(np, int):
            raise ConfigError(f"np must be an int (np > 0: Spark tasks, np < 0: local processes), got {np!r}")
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        local_mode = np < 0
        num = abs(np) if np != 0 else 1  # np == 0 is resolved against the cluster in run()
        super().__init__(num_processes=num, backend="horovod", local_mode=local_mode,
                         verbose=driver_log_verbosity == "all", **options)

    def run(self, main, **kwargs):  # noqa: D401 - same contract as Databricks'
        if self.np == 0:
            from .resources import cluster_task_slots

            self._args["num_processes"] = max(cluster_task_slots(self._session().sparkContext), 1)
        return super().run(main, **kwargs)
