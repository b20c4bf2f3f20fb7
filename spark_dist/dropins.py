"""Drop-in replacements: moving from PySpark's TorchDistributor or DeepspeedTorchDistributor, or Databricks'
HorovodRunner, or Databricks' ``@distributed`` decorator, is one changed import. Each keeps its original's signature, defaults, public attributes and
errors (tested side by side with PySpark's in ``tests/spark/test_pyspark_parity.py`` and
``tests/spark/test_deepspeed_parity.py``); underneath is spark_dist's launcher."""
from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Dict, Optional, Union

from .spark import session
from .config import (CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL, CONF_TASK_GPUS, CONF_TORCH_DISTRIBUTOR_IGNORE_SSL,
                     ranks_per_task, require_task_gpus)
from .errors import ClusterConfigError, ConfigError
from .driver.distributor import Distributor


def _argument(name: str) -> property:
    """A public attribute backed by the run arguments: PySpark code reads and sets these on the instance."""
    return property(lambda self: self._args[name], lambda self, value: self._args.__setitem__(name, value),
                    doc=f"The ``{name}`` the next ``run`` uses.")


class TorchDistributor(Distributor):
    """PySpark's ``pyspark.ml.torch.distributor.TorchDistributor``: same arguments, defaults, attributes
    (``num_processes``, ``local_mode``, ``use_gpu``, ``num_tasks``, ``ssl_conf``, ``spark``, ``input_params``)
    and rank layout: each Spark task is a torchrun node (``LOCAL_RANK`` 0, ``NODE_RANK`` = its task index,
    ``CUDA_VISIBLE_DEVICES`` = the task's own GPUs; with ``spark.task.resource.gpu.amount`` = k > 1 a task runs
    k ranks, as PySpark 4.2+ does), and ``CUDA_VISIBLE_DEVICES=""`` with ``use_gpu=False``. In local mode the
    ranks are one node on the driver and share its GPUs: those of Spark's driver resources
    (``spark.driver.resource.gpu.*``) on a classic session, as PySpark takes them; under Connect, this
    client's own.

    ``run(train_object, *args, **kwargs)`` runs a function with ``args`` and *every* keyword argument
    (returns rank 0's value) or a ``.py`` path with its command-line arguments (returns ``None``).
    spark_dist's datasets: :meth:`run_with_datasets`. Further :class:`~spark_dist.Distributor` options
    (``max_retries``, ``timeout``, ``log_ranks``, ...) may be passed as keywords after PySpark's.

    Raises:
        ClusterConfigError: (a ``RuntimeError``, as PySpark's) ``use_gpu=True`` without GPU scheduling
            (``spark.task.resource.gpu.amount`` unset; no GPUs on the driver in local mode), or
            ``num_processes`` not a multiple of the GPUs per task.
        ConfigError: (a ``ValueError``, as PySpark's) ``num_processes`` is not a positive integer, or another
            bad argument.
    """

    num_processes = _argument("num_processes")
    local_mode = _argument("local_mode")
    use_gpu = _argument("use_gpu")

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True,
                 _ssl_conf: str = CONF_TORCH_DISTRIBUTOR_IGNORE_SSL, **options: Any):
        super().__init__(num_processes=num_processes, backend="ddp", local_mode=local_mode, use_gpu=use_gpu,
                         layout="task", **options)
        self.logger = logging.getLogger(type(self).__name__)
        self.ssl_conf = _ssl_conf
        self.spark = self._session()
        self.is_remote = self.spark is not None and session.is_connect(self.spark)
        self.is_spark_local_master = self.spark is not None and session.is_local_master(self.spark)
        self.num_tasks = self._get_num_tasks()
        self.input_params: Dict[str, Any] = dict(num_processes=self.num_processes, local_mode=self.local_mode,
                                                 use_gpu=self.use_gpu, num_tasks=self.num_tasks)

    def _get_num_tasks(self) -> int:
        """PySpark's check of the GPU set-up, in the constructor: the Spark tasks a run takes.

        Raises:
            ClusterConfigError: as the class says.
        """
        if not self.use_gpu:
            return self.num_processes
        conf = session.conf_snapshot(self.spark, ()) if self.spark is not None else {}
        if not self.local_mode:
            require_task_gpus(conf)
            return self.num_processes // ranks_per_task(conf, self.num_processes)
        available = _driver_gpu_count(self.spark)
        if not available:
            raise ClusterConfigError("GPUs were unable to be found on the driver: pass use_gpu=False, or give "
                                     "the driver GPUs (spark.driver.resource.gpu.amount)")
        if self.num_processes > available:
            self.logger.warning("'num_processes' cannot be set to a value greater than the number of available "
                                "GPUs on the driver, which is %d. 'num_processes' was reset to be equal to the "
                                "number of available GPUs.", available)
            self.num_processes = available
        return self.num_processes

    def run(self, train_object, *args, **kwargs):
        """Run ``train_object(*args, **kwargs)`` (every keyword, ``datasets`` too, goes to the function) or the
        script ``train_object`` with command-line ``args``; return rank 0's value (``None`` for a script).

        Raises:
            ConfigError, TrainingFailedError, RunTimeoutError: as :meth:`spark_dist.Distributor.run`.
        """
        return self._run(train_object, args, kwargs, None)

    def run_with_datasets(self, datasets: Dict[str, Any], train_object, /, *args, **kwargs):
        """:meth:`run` with spark_dist's datasets: each DataFrame of ``datasets`` is read by the ranks through
        ``get_context().loader(name, ...)`` (see :meth:`spark_dist.Distributor.run`). A method of its own so
        that no keyword of the user's function is taken.

        Raises:
            ConfigError, DatasetError, TrainingFailedError, RunTimeoutError: as :meth:`spark_dist.Distributor.run`.
        """
        return self._run(train_object, args, kwargs, datasets)


class DeepspeedTorchDistributor(TorchDistributor):
    """PySpark's ``pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor``: same arguments and
    defaults (``numGpus=1, nnodes=1, localMode=True, useGpu=True, deepspeedConfig=None``), attributes
    (``deepspeed_config``, ``cleanup_deepspeed_conf``, ``ssl_conf`` = ``deepspeed.spark.distributor.ignoreSsl``
    and :class:`TorchDistributor`'s) and rank layout: ``numGpus * nnodes`` ranks, each Spark task a torchrun
    node, as :class:`TorchDistributor` runs them.

    ``deepspeedConfig`` (a dict, the path of a JSON file, or ``None`` for DeepSpeed's defaults) reaches a
    script, and the ``sys.argv`` of a function, as PySpark passes it: ``--deepspeed --deepspeed_config FILE``
    after the script's own arguments (``--deepspeed`` alone without a config). FILE is the path given where it
    exists on the rank's host, else a private copy of what the driver read. Beyond PySpark, a function reads
    the config itself as ``spark_dist.get_context().deepspeed_config`` (a dict, or ``None``)::

        def train():
            import deepspeed
            ctx = spark_dist.get_context()
            engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ctx.deepspeed_config)

    ``run(train_object, *args, **kwargs)``, :meth:`run_with_datasets` and the further
    :class:`~spark_dist.Distributor` options (``max_retries``, ``timeout``, ...) are :class:`TorchDistributor`'s.

    Raises:
        ConfigError: (a ``ValueError``) ``numGpus`` or ``nnodes`` is not a positive integer; at ``run``, before
            any job: ``deepspeedConfig`` of another type, a dict that is not JSON, a file that is neither JSON
            nor HJSON, or (local mode) a path that does not exist.
        ClusterConfigError: (a ``RuntimeError``) as :class:`TorchDistributor`'s.
    """

    _DEEPSPEED_SSL_CONF = CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL

    def __init__(self, numGpus: int = 1, nnodes: int = 1, localMode: bool = True, useGpu: bool = True,
                 deepspeedConfig: Optional[Union[str, Dict[str, Any]]] = None, **options: Any):
        for name, value in (("numGpus", numGpus), ("nnodes", nnodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                # "positive": the word of PySpark's message (num_processes = numGpus * nnodes)
                raise ConfigError(f"{name} has to be a positive integer, got {value!r}")
        self.deepspeed_config = deepspeedConfig
        super().__init__(numGpus * nnodes, localMode, useGpu, _ssl_conf=self._DEEPSPEED_SSL_CONF, **options)
        self.cleanup_deepspeed_conf = False
        self.input_params = {"deepspeed_config": deepspeedConfig, **self.input_params}

    def _job_fields(self, train_object) -> Dict[str, Any]:
        """The config for the ranks (see :mod:`spark_dist.task.deepspeed_args`), checked here.

        Raises:
            ConfigError: as the class says.
        """
        from .task.deepspeed_args import parse

        config = self.deepspeed_config
        if config is None or config == "":  # PySpark: no --deepspeed_config, DeepSpeed's defaults
            return {"deepspeed": True}
        if isinstance(config, dict):
            import json

            try:
                text = json.dumps(config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"deepspeedConfig must be a JSON-serialisable dict: {exc}") from None
            return {"deepspeed": True, "deepspeed_config_text": text}
        if not isinstance(config, (str, os.PathLike)):
            raise ConfigError(f"deepspeedConfig must be a dict, the path of a JSON file or None, "
                              f"got {type(config).__name__}")
        path = os.fspath(config)
        if not os.path.isfile(path):
            if self.local_mode:
                raise ConfigError(f"deepspeedConfig file {path!r} does not exist (local mode runs the ranks here)")
            return {"deepspeed": True, "deepspeed_config_path": path}  # it may exist on the executors only
        with open(path, encoding="utf-8") as f:
            text = f.read()
        parse(text, f"file {path!r}")
        return {"deepspeed": True, "deepspeed_config_path": os.path.abspath(path), "deepspeed_config_text": text}


def _driver_gpu_count(spark) -> int:
    """GPUs the driver has: Spark's driver resources (``spark.driver.resource.gpu.*``), as PySpark counts
    them; without a session, CUDA's own count."""
    if spark is None:
        import torch

        return torch.cuda.device_count()
    gpus = session.driver_resources(spark).get("gpu")
    return len(gpus.addresses) if gpus is not None else 0


class HorovodRunner(Distributor):
    """Databricks' ``sparkdl.HorovodRunner`` on spark_dist's Horovod backend, with its signature.

    Args:
        np: ``np > 0``: np Spark tasks (waits for that many task slots, fails when the cluster has fewer);
            ``np < 0``: -np processes on the driver, no Spark job; ``np == 0``: one task per task slot of
            the cluster, counted when ``run`` is called.
        driver_log_verbosity: ``"log_callback_only"`` (the default, as Databricks'): the driver shows only
            what the ranks send with :func:`spark_dist.log_to_driver`; ``"all"``: it also shows every line the
            ranks print (prefixed ``[rank N]``), their ``ctx.report`` metrics and a summary. With ``np < 0`` the
            ranks' output always shows, as on Databricks.

    ``run(main, **kwargs)`` calls ``main(**kwargs)`` on every rank and returns rank 0's value. For retries,
    timeouts or datasets use ``Distributor(backend="horovod")``.

    Raises:
        ConfigError: ``np`` is not an int, or ``driver_log_verbosity`` is not one of the two values.
    """

    def __init__(self, *, np, driver_log_verbosity="log_callback_only"):
        if isinstance(np, bool) or not isinstance(np, int):
            raise ConfigError(f"np must be an int (np > 0: Spark tasks, np < 0: processes on the driver, "
                              f"np == 0: every task slot), got {np!r}")
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise ConfigError(f"driver_log_verbosity must be 'all' or 'log_callback_only', "
                              f"got {driver_log_verbosity!r}")
        self.num_processor = np  # Databricks' attribute name
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        everything = driver_log_verbosity == "all"
        # np == 0 is resolved against the cluster in run(); 1 only passes the argument check here.
        super().__init__(num_processes=abs(np) or 1, backend="horovod", local_mode=np < 0, verbose=everything,
                         log_ranks="all" if everything or np < 0 else "none")

    def run(self, main, **kwargs):
        """Run ``main(**kwargs)`` on every rank; return rank 0's value.

        Raises:
            ConfigError, TrainingFailedError, RunTimeoutError: as :meth:`spark_dist.Distributor.run`.
        """
        if self.np == 0:
            slots = session.task_slots(self._session())
            if slots is None:
                raise ConfigError("np=0 runs one process per task slot, but this Spark Connect session cannot "
                                  "tell the slot count (no spark.executor.instances and spark.executor.cores in "
                                  "its conf): pass np > 0")
            self._args["num_processes"] = max(slots, 1)
        return self._run(main, (), kwargs, None)


def distributed(gpus: int = 1, gpu_type: Optional[str] = None, remote: Optional[bool] = None, *,
                use_gpu: Optional[bool] = None, **settings):
    """Databricks' ``@distributed(gpus=N)`` decorator (its AI Runtime's ``serverless_gpu``), on a Spark cluster:
    ``fn.distributed(*args, **kwargs)`` runs ``fn`` on ``gpus`` ranks, as Spark barrier tasks, and returns one
    value per rank, in rank order; ``fn(...)`` itself still calls the plain function. Each rank has the torchrun
    variables, so ``torch.distributed.init_process_group()`` works with no arguments.

    ``use_gpu``: one GPU per rank; by default where the session schedules GPUs (``spark.task.resource.gpu
    .amount``), else CPU ranks. ``gpu_type`` and ``remote`` choose a GPU kind and a remote pool on Databricks:
    a Spark cluster's executors are what they are, so they are accepted and named in a warning. ``settings`` go to
    :class:`spark_dist.Distributor` (``max_retries``, ``timeout``, ``checkpoint_dir``, ``backend``...).

    Raises:
        ConfigError: ``gpus`` is not a positive int (at decoration); at ``.distributed``, what
            :meth:`spark_dist.Distributor.run` raises.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"gpus must be a positive int (the ranks to run), got {gpus!r}")
    ignored = [f"{name}={value!r}" for name, value in (("gpu_type", gpu_type), ("remote", remote))
               if value is not None]
    if ignored:
        warnings.warn(f"distributed({', '.join(ignored)}): {' and '.join(ignored)} do not apply on a Spark "
                      "cluster, whose executors are what they are: ignored", UserWarning, stacklevel=2)

    def decorate(fn):
        def run_everywhere(*args, **kwargs):
            runner = _EveryRank(num_processes=gpus, use_gpu=_gpus_scheduled() if use_gpu is None else use_gpu,
                                **settings)
            return runner.run(fn, *args, **kwargs)

        fn.distributed = functools.wraps(fn)(run_everywhere)
        return fn
    return decorate


class _EveryRank(Distributor):
    """A Distributor whose ``run`` returns every rank's value, in rank order."""

    _every_result = True


def _gpus_scheduled() -> bool:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return False
    try:
        return float(spark.conf.get(CONF_TASK_GPUS, "0") or 0) > 0
    except Exception:  # noqa: BLE001 -- a session that cannot say schedules none we can use
        return False
