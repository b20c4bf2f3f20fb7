"""Drop-in replacements: moving from PySpark's TorchDistributor or Databricks' HorovodRunner is one
changed import."""
from __future__ import annotations

import functools
from typing import Any

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
    """Databricks' ``sparkdl.HorovodRunner`` on spark_dist's Horovod backend.

    Args:
        np: ``np > 0``: np Spark tasks (waits for that many task slots, fails when the cluster has fewer);
            ``np < 0``: -np processes on the driver, no Spark job; ``np == 0``: one task per task slot of
            the cluster, counted when ``run`` is called.
        driver_log_verbosity: ``"all"`` prints every ``ctx.report`` and a summary on the driver;
            ``"log_callback_only"`` keeps the driver quiet (reports stay in ``history``).
        options: further :class:`~spark_dist.Distributor` arguments (``timeout``, ``max_retries``, ...).

    ``run(main, **kwargs)`` calls ``main(**kwargs)`` on every rank and returns rank 0's value.

    Raises:
        ConfigError: ``np`` is not an int, or ``driver_log_verbosity`` is not one of the two values.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "all", **options: Any):
        if isinstance(np, bool) or not isinstance(np, int):
            raise ConfigError(f"np must be an int (np > 0: Spark tasks, np < 0: processes on the driver, "
                              f"np == 0: every task slot), got {np!r}")
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise ConfigError(f"driver_log_verbosity must be 'all' or 'log_callback_only', "
                              f"got {driver_log_verbosity!r}")
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        options.setdefault("verbose", driver_log_verbosity == "all")
        # np == 0 is resolved against the cluster in run(); 1 only passes the argument check here.
        super().__init__(num_processes=abs(np) or 1, backend="horovod", local_mode=np < 0, **options)

    def run(self, main, **kwargs):
        """Run ``main(**kwargs)`` on every rank; return rank 0's value.

        Raises:
            ConfigError, TrainingFailedError, RunTimeoutError: as :meth:`spark_dist.Distributor.run`.
        """
        if self.np == 0:
            from . import session

            slots = session.task_slots(self._session())
            if slots is None:
                raise ConfigError("np=0 runs one process per task slot, but this Spark Connect session cannot "
                                  "tell the slot count (no spark.executor.instances and spark.executor.cores in "
                                  "its conf): pass np > 0")
            self._args["num_processes"] = max(slots, 1)
        # Every keyword belongs to main (Databricks' contract), ``datasets`` included: bind them here so
        # Distributor.run sees none of them. Keeping main's module lets it be pickled by value as usual.
        bound = functools.partial(main, **kwargs)
        bound.__module__ = getattr(main, "__module__", None)
        return super().run(bound)
