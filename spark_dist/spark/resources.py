"""Slots and GPUs: how many barrier tasks the cluster can run at once, and which GPUs a task owns."""
from __future__ import annotations

import os
import re
import time
from typing import List, Optional, Sequence

from . import session
from ..errors import ConfigError, ClusterConfigError


def wait_for_slots(spark, needed: int, timeout: float, use_gpu: bool, ranks_per_task: int = 1) -> Optional[int]:
    """Return the slot count once it reaches ``needed``; executors may still be registering, so wait up
    to ``timeout`` seconds rather than fail at once (not on a ``local[N]`` master, whose slots are all there
    from the start), but never Spark's own 10-minute barrier wait. ``None`` (at once) where the count is
    unknown: under Spark Connect without the conf that tells it (see :func:`spark_dist.spark.session.task_slots`).

    Raises:
        ConfigError: the cluster has fewer slots than ``needed`` (the run's tasks, of ``ranks_per_task`` ranks
            each) after ``timeout`` seconds.
    """
    # A local[N] master has all its slots from the start: waiting would only delay the error.
    deadline = time.monotonic() + (0 if session.is_local_master(spark) else timeout)
    slots = session.task_slots(spark)
    if slots is None:
        return None
    while slots < needed and time.monotonic() < deadline:
        time.sleep(0.25)
        slots = session.task_slots(spark)
    if slots < needed:
        tasks = f" ({needed} tasks of {ranks_per_task} GPUs)" if ranks_per_task > 1 else ""
        unit = "GPU task slots (spark.task.resource.gpu.amount per task)" if use_gpu else "task slots"
        raise ConfigError(
            f"num_processes={needed * ranks_per_task}{tasks} but the cluster has {slots} {unit} (master "
            f"{session.master(spark)}): lower "
            "num_processes, add executors or cores, or raise spark.dist.slotWaitTimeout if executors are "
            "still starting"
        )
    return slots


def task_gpu_addresses(task_context) -> List[str]:
    """The GPU addresses Spark assigned to this task (empty without GPU scheduling)."""
    resources = task_context.resources()
    gpu = resources.get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def cuda_ordinal(address: str) -> int:
    """The CUDA device index of the GPU Spark calls ``address`` in this process: its position in
    ``CUDA_VISIBLE_DEVICES`` when that hides some GPUs (YARN and Kubernetes set it), else the address."""
    visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if address in visible:
        return visible.index(address)
    return int(address) if address.isdigit() else 0


def local_gpu_addresses(count: int, spark=None) -> List[str]:
    """GPUs for ``count`` processes on the driver (local mode), as PySpark's TorchDistributor takes them: on a
    classic session whose driver has Spark GPUs (``spark.driver.resource.gpu.*``), those
    (:func:`driver_spark_gpus`); else (no such resources, no session, or Spark Connect, where the ranks run by
    this client and only its own GPUs count) this process's CUDA_VISIBLE_DEVICES, or CUDA's first devices.

    Raises:
        ClusterConfigError: fewer GPUs than processes, naming the setting that gives the driver GPUs.
    """
    if spark is not None and not session.is_connect(spark):
        gpus = session.driver_resources(spark).get("gpu")
        if gpus is not None:
            return driver_spark_gpus(list(gpus.addresses), count)
    import torch

    available = torch.cuda.device_count()
    if available < count:
        raise ClusterConfigError(
            f"use_gpu=True with local_mode=True needs {count} GPUs on the driver, found {available}: "
            "lower num_processes, pass use_gpu=False, or give the driver GPUs (spark.driver.resource.gpu.amount)"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # the driver was given some GPUs: hand those on, not the machine's first ones
        return [g.strip() for g in visible.split(",")][:count]
    return [str(i) for i in range(count)]


def driver_spark_gpus(addresses: Sequence[str], count: int) -> List[str]:
    """The first ``count`` of the driver's Spark GPU ``addresses``, as CUDA_VISIBLE_DEVICES names them. Where
    the driver's own CUDA_VISIBLE_DEVICES is set, an address is a position in it (PySpark's ``_get_gpus_owned``).

    Raises:
        ClusterConfigError: fewer addresses than ``count``, or addresses that are not CUDA device indices.
    """
    if len(addresses) < count:
        raise ClusterConfigError(
            f"use_gpu=True with local_mode=True needs {count} GPUs on the driver, but its Spark resources have "
            f"{len(addresses)} ({', '.join(addresses)}): lower num_processes, or raise "
            "spark.driver.resource.gpu.amount (and the GPUs its discovery script finds)")
    if not all(re.fullmatch(r"0|[1-9][0-9]*", a) for a in addresses):
        raise ClusterConfigError(
            f"the driver's Spark GPU addresses {list(addresses)} are not CUDA device indices (integers without "
            "leading zeros), which CUDA_VISIBLE_DEVICES needs: fix spark.driver.resource.gpu.discoveryScript")
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        return list(addresses[:count])
    visible = [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    if any(int(a) >= len(visible) for a in addresses[:count]):
        raise ClusterConfigError(
            f"the driver's Spark GPU addresses {list(addresses)} are positions in its CUDA_VISIBLE_DEVICES="
            f"{os.environ['CUDA_VISIBLE_DEVICES']!r}, which lists fewer GPUs: fix "
            "spark.driver.resource.gpu.discoveryScript or the driver's CUDA_VISIBLE_DEVICES")
    return [visible[int(a)] for a in addresses[:count]]
