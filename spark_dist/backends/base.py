"""The backend interface and registry.

A backend has three hooks: ``check_available`` (driver, before any job), ``start`` (driver, once the ranks
are known: returns extra environment for every rank) and ``stop`` (driver, whatever the outcome). The
torchrun variables are common to every backend and set here.
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional

from ..errors import ConfigError
from ..wire.ranks import RankInfo

_REGISTRY = {
    "ddp": "spark_dist.backends.ddp:DDPBackend",
    "horovod": "spark_dist.backends.horovod:HorovodBackend",
}


class Backend:
    """Base class: a backend that needs nothing beyond the torchrun variables."""

    name = "base"

    def __init__(self, config=None):
        self.config = config  # the run's RunConfig (None where only check_available is asked)

    def check_available(self) -> None:
        """Raise :class:`~spark_dist.errors.BackendUnavailableError` when the backend cannot run here."""

    def start(self, ranks: List[RankInfo], driver_host: str, run_id: str,
              bind_address: Optional[str] = None) -> Dict[int, Dict[str, str]]:
        """Start driver-side services for this attempt, listening on ``bind_address`` (default
        ``driver_host``), which ranks reach as ``driver_host``; return extra env per rank (by rank number)."""
        return {r.rank: {} for r in ranks}

    def stop(self) -> None:
        """Stop what ``start`` started. Must be safe to call more than once and after a failed start."""


def torchrun_env(rank: RankInfo, store_host: str, store_port: int, attempt: int, use_gpu: bool) -> Dict[str, str]:
    """The variables torchrun sets, so ``init_process_group()`` with no arguments, Lightning and torchrun
    scripts work. All ranks join the driver's store as clients (torchelastic's agent-store mode)."""
    env = {
        "RANK": str(rank.rank),
        "LOCAL_RANK": str(rank.local_rank),
        "WORLD_SIZE": str(rank.world_size),
        "LOCAL_WORLD_SIZE": str(rank.local_world_size),
        "GROUP_RANK": str(rank.node_rank),
        "NODE_RANK": str(rank.node_rank),
        "GROUP_WORLD_SIZE": str(rank.num_nodes),
        "ROLE_RANK": str(rank.rank),
        "ROLE_WORLD_SIZE": str(rank.world_size),
        "MASTER_ADDR": store_host,
        "MASTER_PORT": str(store_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_RUN_ID": "spark_dist",
    }
    # use_gpu=False hides the GPUs, as PySpark does: code that picks "cuda if available" stays on the CPU.
    env["CUDA_VISIBLE_DEVICES"] = rank.cuda_visible_devices if use_gpu else ""
    return env


def get_backend(name: str, config=None) -> Backend:
    """A fresh backend instance by name, for the run ``config`` (a RunConfig: its settings, such as
    ``horovod_rendezvous_ports``; ``None`` for a backend only asked whether it is available).

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"backend must be one of {', '.join(sorted(_REGISTRY))}, got {name!r}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)(config)
