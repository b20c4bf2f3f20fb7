"""Run settings: one frozen dataclass, validated once on the driver, built from arguments and Spark conf.

Every error names the parameter or conf key to change and is raised before any Spark job.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from .conf_values import conf_bool, conf_choice, conf_count, conf_seconds, parse_size, port_range  # noqa: F401
from .errors import ConfigError, ClusterConfigError
from .wire.ranks import LAYOUTS

# Spark conf keys that spark_dist reads (all optional).
CONF_CHECKPOINT_DIR = "spark.dist.checkpointDir"
CONF_ALLOW_UNENCRYPTED = "spark.dist.allowUnencryptedTraining"
CONF_TORCH_DISTRIBUTOR_IGNORE_SSL = "pytorch.spark.distributor.ignoreSsl"  # honoured for drop-in users
CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL = "deepspeed.spark.distributor.ignoreSsl"  # the same, PySpark's DeepSpeed key
CONF_SLOT_WAIT = "spark.dist.slotWaitTimeout"
CONF_RETRY_SLOT_WAIT = "spark.dist.retrySlotWaitTimeout"
CONF_MIN_PROCESSES = "spark.dist.minProcesses"
CONF_MAX_PREEMPTIONS = "spark.dist.maxPreemptions"
CONF_MAX_SHORT_GROWS = "spark.dist.maxShortGrows"
CONF_HOST_LOST_TIMEOUT = "spark.dist.hostLostTimeout"
CONF_REPLACE_LOST_EXECUTORS = "spark.dist.replaceLostExecutors"
CONF_RENDEZVOUS_TIMEOUT = "spark.dist.rendezvousTimeout"
CONF_ABORT_GRACE = "spark.dist.abortGracePeriod"
CONF_COLLECTIVE_TIMEOUT = "spark.dist.collectiveTimeout"
CONF_STORE_PORT = "spark.dist.storePort"
CONF_HOROVOD_RENDEZVOUS_PORT = "spark.dist.horovod.rendezvousPort"
CONF_HOROVOD_IMPL = "spark.dist.horovod.impl"  # auto | horovod | torch: see backends/horovod.py
CONF_STALL_TIMEOUT = "spark.dist.stallTimeout"
CONF_STALL_ACTION = "spark.dist.stallAction"
STALL_ACTIONS = ("warn", "fail", "off")  # see spark_dist/driver/stall.py
# Keys also read from the session's runtime conf (spark.conf.set) at each run.
# spark.ssl.enabled too: PySpark's TorchDistributor reads it with spark.conf.get, so a value set at run time counts.
RUNTIME_KEYS = ("spark.ssl.enabled", CONF_CHECKPOINT_DIR, CONF_ALLOW_UNENCRYPTED, CONF_TORCH_DISTRIBUTOR_IGNORE_SSL,
                CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL,
                CONF_SLOT_WAIT, CONF_RETRY_SLOT_WAIT, CONF_MIN_PROCESSES, CONF_MAX_PREEMPTIONS, CONF_MAX_SHORT_GROWS,
                CONF_RENDEZVOUS_TIMEOUT, CONF_ABORT_GRACE,
                CONF_COLLECTIVE_TIMEOUT, CONF_HOST_LOST_TIMEOUT, CONF_REPLACE_LOST_EXECUTORS, CONF_STORE_PORT,
                CONF_HOROVOD_RENDEZVOUS_PORT, CONF_HOROVOD_IMPL, CONF_STALL_TIMEOUT, CONF_STALL_ACTION)
CONF_TASK_GPUS = "spark.task.resource.gpu.amount"

BACKENDS = ("ddp", "horovod")


def slot_wait_timeout(conf: Mapping[str, str]) -> float:
    """Seconds to wait for enough task slots (conf ``spark.dist.slotWaitTimeout``, default 30).

    Raises:
        ConfigError: the value is not a positive number of seconds.
    """
    return conf_seconds(conf, CONF_SLOT_WAIT, 30.0)


def task_gpu_amount(conf: Mapping[str, str]) -> float:
    """``spark.task.resource.gpu.amount`` (0 when unset).

    Raises:
        ConfigError: the value is not a number.
    """
    value = conf.get(CONF_TASK_GPUS)
    if value in (None, ""):
        return 0.0
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"Spark conf {CONF_TASK_GPUS}={value!r} is not a number") from None


def require_task_gpus(conf: Mapping[str, str]) -> None:
    """Check that Spark schedules GPUs to tasks, for a run with ``use_gpu=True`` on Spark tasks.

    Raises:
        ClusterConfigError: ``spark.task.resource.gpu.amount`` is unset (PySpark's words, which code matches).
    """
    if task_gpu_amount(conf) <= 0:
        raise ClusterConfigError(f"'{CONF_TASK_GPUS}' was unset, so gpu usage is unavailable: set it (and "
                                 "spark.executor.resource.gpu.amount with a discovery script), or pass "
                                 "use_gpu=False")


def ranks_per_task(conf: Mapping[str, str], num_processes: int) -> int:
    """How many ranks each Spark task runs: one per GPU of the task (``spark.task.resource.gpu.amount``
    GPUs, as PySpark 4.2+ and torchrun's one-process-per-GPU convention do), else one.

    Raises:
        ConfigError: the amount is a fraction above 1; :class:`ClusterConfigError` ``num_processes`` is not a
            multiple of it.
    """
    amount = task_gpu_amount(conf)
    if amount <= 1:
        return 1
    if amount != int(amount):
        raise ConfigError(f"{CONF_TASK_GPUS}={conf[CONF_TASK_GPUS]!r}: above 1 it must be a whole number of "
                          "GPUs, one rank each")
    if num_processes % int(amount):
        raise ClusterConfigError(f"num_processes ({num_processes}) must be a multiple of '{CONF_TASK_GPUS}' "
                                 f"({int(amount)}) value: each Spark task runs one rank per GPU it holds")
    return int(amount)


def _max_result_bytes(conf: Mapping[str, str]) -> int:

    value = conf.get(MAX_RESULT_SIZE_CONF, "1g")  # Spark's default
    try:
        return parse_size(value)
    except ValueError:
        raise ConfigError(f"{MAX_RESULT_SIZE_CONF}={value!r} is not a size (e.g. 1g, 512m, 0 for no limit)") from None


def checkpoint_root(value: str, key: str) -> str:
    """The directory under which each run keeps its checkpoints (in ``<root>/<run_id>/``), as a local path.

    Raises:
        ConfigError (naming ``key``): a relative path (it would land in whatever directory each executor
            runs in), or a URL ``torch.save`` cannot write (``hdfs://``, ``s3a://``, ``dbfs:/``): use the
            filesystem's mount (``/dbfs/...``, an NFS path) instead. ``file:`` URLs are taken as paths.
    """
    path = value.strip()
    scheme, sep, rest = path.partition(":")
    if sep and "/" not in scheme:
        if scheme != "file":
            raise ConfigError(f"{key}={value!r}: checkpoints are written with torch.save, which cannot write "
                              f"{scheme}: URLs; use a path on a filesystem every executor mounts (for example "
                              "/dbfs/... or an NFS path)")
        path = "/" + rest.lstrip("/")
    if not os.path.isabs(path):
        raise ConfigError(f"{key}={value!r} is a relative path, which each executor would resolve in its own "
                          "working directory; give an absolute path on a filesystem every executor sees")
    return os.path.normpath(path)


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``Distributor.run`` needs to know, checked once."""

    num_processes: int
    # An elastic run (min_processes < num_processes) may run an attempt on fewer ranks, down to this many.
    min_processes: int = 0  # 0: num_processes (fixed size)
    max_preemptions: int = 10  # restarts after a decommissioned executor, a budget apart from max_retries
    max_short_grows: int = 5  # grows whose next attempt got fewer than num_processes ranks; then no more grows
    # An attempt's own (the Distributor sets it): how long the missing ranks' slots must stay free before the
    # attempt stops to grow; longer after each grow that fell short, inf once max_short_grows are spent.
    grow_wait: float = 0.0
    backend: str = "ddp"
    local_mode: bool = False
    use_gpu: bool = False
    max_retries: int = 0
    timeout: Optional[float] = None
    run_id: str = ""
    resume: bool = False  # True when the caller named run_id: checkpoints of that run are resumed
    checkpoint_dir: Optional[str] = None  # the root: this run's checkpoints go to <checkpoint_dir>/<run_id>
    driver_host: str = "127.0.0.1"   # the address ranks connect to (spark.driver.host)
    bind_address: str = "127.0.0.1"  # where the driver's listeners bind (spark.driver.bindAddress, else the host)
    slot_wait_timeout: float = 30.0
    retry_slot_wait_timeout: float = 600.0  # before a retry: time for the cluster to replace lost executors
    rendezvous_timeout: float = 300.0
    abort_grace_period: float = 5.0
    host_lost_timeout: float = 10.0  # ranks silent this long (no heartbeat) mean their host is lost
    # Then the driver asks Spark to replace their executors (what Spark does at its own executor timeout); a user
    # who would rather leave their cluster to Spark turns it off.
    replace_lost_executors: bool = True
    collective_timeout: Optional[float] = None  # default timeout of init_process_group in the ranks
    # No rank finished a step for this long while all are alive: the driver diagnoses a stall from their stacks.
    # Five minutes: longer than a step, a checkpoint or an evaluation of most runs, and well before the
    # collectives' own timeouts (NCCL's 10 minutes, gloo's 30) would end a hung run without saying where.
    stall_timeout: float = 300.0
    stall_action: str = "warn"  # then: warn (print it, go on), fail (RunStalledError), off (never watched)
    store_ports: Optional[Tuple[int, int]] = None  # the run's store binds one of these (first, last); None: any
    horovod_rendezvous_ports: Optional[Tuple[int, int]] = None  # the same for Horovod's rendezvous server
    max_result_bytes: int = 0  # spark.driver.maxResultSize: the most rank 0's result may be (0: no bound)
    layout: str = "host"  # what a torchrun "node" is: a host, or a Spark task (PySpark's); see assign_ranks
    processes_per_task: int = 1  # ranks per Spark task: one per GPU of a multi-GPU task
    ssl_enabled: bool = False
    allow_unencrypted: bool = False
    spark_conf: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tasks(self) -> int:
        """The barrier job's task count (local mode: the number of rank processes)."""
        return self.num_processes // self.processes_per_task

    @property
    def elastic(self) -> bool:
        """Whether an attempt may run on fewer ranks than ``num_processes`` (``min_processes`` below it)."""
        return 0 < self.min_processes < self.num_processes

    def job_tag(self, attempt: int) -> str:
        """The job group (tag under Spark Connect) of the run's attempt ``attempt``: what cancels its job."""
        return f"spark_dist-{self.run_id}-{attempt}"

    def job_description(self, attempt: int) -> str:
        """What the Spark UI shows for the run's job: run id, attempt, ranks and backend."""
        return (f"spark_dist run {self.run_id} attempt {attempt}: {self.num_processes} ranks, {self.backend}"
                f"{', GPU' if self.use_gpu else ''}")

    @classmethod
    def build(
        cls,
        *,
        num_processes,
        backend="ddp",
        local_mode=False,
        use_gpu=False,
        max_retries=0,
        min_processes=None,
        timeout=None,
        run_id=None,
        checkpoint_dir=None,
        layout="host",
        spark_conf: Optional[Mapping[str, str]] = None,
        arguments_only: bool = False,
    ) -> "RunConfig":
        """Validate the arguments and the Spark conf (only the arguments with ``arguments_only``, as a
        constructor does before a session is known).

        Raises:
            ConfigError: naming the argument or conf key that is wrong; :class:`ClusterConfigError`
                (also a ``RuntimeError``) for GPUs that are not scheduled, ``num_processes`` not a multiple
                of the GPUs per task, and a cluster that requires encryption.
        """
        conf = dict(spark_conf or {})
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes <= 0:
            # "positive": the word PySpark's message (and code matching it) uses.
            raise ConfigError(f"num_processes has to be a positive integer, got {num_processes!r}")
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
        if layout == "task" and backend == "horovod":
            raise ConfigError("layout='task' cannot run backend='horovod': Horovod's local and cross "
                              "communicators need every rank of a host in one node; use layout='host'")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}")
        min_processes = _min_processes(min_processes, conf, num_processes)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
            timeout = float(timeout)
        if run_id is not None and (not isinstance(run_id, str)
                                   or not run_id.replace("-", "").replace("_", "").isalnum()):
            raise ConfigError(f"run_id must be letters, digits, '-' or '_', got {run_id!r}")
        if checkpoint_dir:
            checkpoint_dir = checkpoint_root(os.fspath(checkpoint_dir), "checkpoint_dir")
        elif conf.get(CONF_CHECKPOINT_DIR):
            checkpoint_dir = checkpoint_root(conf[CONF_CHECKPOINT_DIR], CONF_CHECKPOINT_DIR)
        else:
            checkpoint_dir = None
        if not local_mode and conf_bool(conf, "spark.dynamicAllocation.enabled"):
            raise ConfigError(
                "barrier-mode training cannot run with dynamic allocation: "
                "set spark.dynamicAllocation.enabled=false"
            )
        if arguments_only:
            conf = {}
        elif not local_mode and use_gpu:
            require_task_gpus(conf)
        ssl_enabled = conf_bool(conf, "spark.ssl.enabled")
        allow_unencrypted = any(conf_bool(conf, key) for key in (
            CONF_ALLOW_UNENCRYPTED, CONF_TORCH_DISTRIBUTOR_IGNORE_SSL, CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL))
        # Local mode keeps the traffic on the driver's machine: allowed, as PySpark checks only task runs.
        if ssl_enabled and not allow_unencrypted and not local_mode:
            raise ClusterConfigError(
                "spark.ssl.enabled is true, but training traffic between ranks (gloo/NCCL/Horovod) has no "
                f"encryption. To run anyway, set {CONF_ALLOW_UNENCRYPTED}=true (or "
                f"{CONF_TORCH_DISTRIBUTOR_IGNORE_SSL}=true or {CONF_DEEPSPEED_DISTRIBUTOR_IGNORE_SSL}=true, "
                "PySpark's keys), or use local_mode=True"
            )
        per_task = 1
        if use_gpu and not local_mode:
            per_task = ranks_per_task(conf, num_processes)
            if min_processes % per_task:
                raise ClusterConfigError(f"min_processes ({min_processes}) must be a multiple of '{CONF_TASK_GPUS}' "
                                         f"({per_task}) value: each Spark task runs one rank per GPU it holds")
        driver_host = conf.get("spark.driver.host") or os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
        # Behind NAT or in a Kubernetes client-mode pod the driver advertises one address and binds another,
        # as Spark's own driver does.
        bind_address = conf.get("spark.driver.bindAddress") or driver_host
        return cls(
            num_processes=num_processes,
            min_processes=min_processes,
            max_preemptions=conf_count(conf, CONF_MAX_PREEMPTIONS, 10),
            max_short_grows=conf_count(conf, CONF_MAX_SHORT_GROWS, 5),
            backend=backend,
            local_mode=bool(local_mode),
            use_gpu=bool(use_gpu),
            max_retries=max_retries,
            timeout=timeout,
            run_id=run_id or uuid.uuid4().hex[:12],
            resume=run_id is not None,
            checkpoint_dir=checkpoint_dir,
            driver_host=driver_host,
            bind_address=bind_address,
            slot_wait_timeout=slot_wait_timeout(conf),
            retry_slot_wait_timeout=conf_seconds(conf, CONF_RETRY_SLOT_WAIT, 600.0),
            rendezvous_timeout=conf_seconds(conf, CONF_RENDEZVOUS_TIMEOUT, 300.0),
            abort_grace_period=conf_seconds(conf, CONF_ABORT_GRACE, 5.0),
            host_lost_timeout=conf_seconds(conf, CONF_HOST_LOST_TIMEOUT, 10.0),
            replace_lost_executors=conf_bool(conf, CONF_REPLACE_LOST_EXECUTORS, True),
            collective_timeout=conf_seconds(conf, CONF_COLLECTIVE_TIMEOUT, 0.0) or None,
            stall_timeout=conf_seconds(conf, CONF_STALL_TIMEOUT, 300.0),
            stall_action=conf_choice(conf, CONF_STALL_ACTION, STALL_ACTIONS, "warn"),
            store_ports=port_range(conf, CONF_STORE_PORT),
            horovod_rendezvous_ports=port_range(conf, CONF_HOROVOD_RENDEZVOUS_PORT),
            # Local-mode results come back through a file, not a Spark task: Spark's bound does not apply.
            max_result_bytes=0 if local_mode else _max_result_bytes(conf),
            ssl_enabled=ssl_enabled,
            allow_unencrypted=allow_unencrypted,
            layout=layout,
            processes_per_task=per_task,
            spark_conf=conf,
        )


MAX_RESULT_SIZE_CONF = "spark.driver.maxResultSize"


def _min_processes(value, conf: Mapping[str, str], num_processes: int) -> int:
    """``min_processes`` (the argument, else conf ``spark.dist.minProcesses``, else ``num_processes``).

    Raises:
        ConfigError: not an integer in ``1..num_processes``, naming the argument or the key.
    """
    name = "min_processes"
    if value is None and conf.get(CONF_MIN_PROCESSES) not in (None, ""):
        name, text = CONF_MIN_PROCESSES, str(conf[CONF_MIN_PROCESSES]).strip()
        value = int(text) if text.isdigit() else text
    if value is None:
        return num_processes
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_processes:
        raise ConfigError(f"{name} must be an integer from 1 to num_processes ({num_processes}), got {value!r}")
    return value
