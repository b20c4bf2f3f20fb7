"""The rank's view of its run: :class:`TrainContext` and :func:`get_context`."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

_current: Optional["TrainContext"] = None

CHECKPOINT_FILE = "checkpoint.pt"
REPORT_KEYS = ("rank", "attempt", "time")  # what every report carries besides the user's metrics
PROGRESS_KEY = "_progress"  # a report holding (epoch, step, steps) of rank 0's loader: the driver's bar
PROGRESS_EVERY_S = 0.25
LOG_KEY = "_log"  # a report holding a log_to_driver message
LOG_MESSAGE_CHARS = 4000  # longer messages are cut, as Databricks' log_to_driver does


@dataclass
class TrainContext:
    """Who this rank is and what it can use. Obtain it with :func:`get_context` inside a function run by
    :meth:`spark_dist.Distributor.run`."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    attempt: int
    run_id: str
    host: str
    use_gpu: bool = False
    gpus: tuple = ()  # the GPU addresses Spark assigned to this rank's task
    checkpoint_dir: Optional[str] = None
    datasets: Dict[str, Any] = field(default_factory=dict, repr=False)
    _reporter: Any = field(default=None, repr=False)
    loaders: list = field(default_factory=list, repr=False)

    @property
    def device(self):
        """``cuda:LOCAL_RANK`` when the run uses GPUs (CUDA_VISIBLE_DEVICES lists this host's task GPUs in
        local-rank order), else ``cpu``."""
        import torch

        return torch.device(f"cuda:{self.local_rank}") if self.use_gpu else torch.device("cpu")

    # -- data -------------------------------------------------------------------------------------------
    def loader(self, name: str, batch_size: int, *, epoch: int = 0, shuffle: bool = True, seed: int = 0,
               columns=None, drop_last: bool = True, dtypes=None):
        """This rank's equal shard of dataset ``name`` as batches (dicts of torch tensors).

        Every rank yields the same number of batches; the order depends only on ``(seed, epoch)``.

        Raises:
            KeyError: ``name`` was not passed in ``datasets=`` to ``run()`` (the message lists those given).
        """
        if name not in self.datasets:
            given = ", ".join(sorted(self.datasets)) or "none"
            raise KeyError(f"dataset {name!r} was not given to run(datasets=...); given: {given}")
        from .data import make_loader

        loader = make_loader(self.datasets[name], rank=self.rank, world_size=self.world_size,
                             batch_size=batch_size, epoch=epoch, shuffle=shuffle, seed=seed,
                             columns=columns, drop_last=drop_last, device=self.device if self.use_gpu else None,
                             dtypes=dtypes)
        if self.rank == 0 and self._reporter is not None:  # the driver's progress bar follows rank 0's loader
            loader.on_progress = self._progress
        self.loaders.append(loader)
        return loader

    def _progress(self, epoch: int, step: int, steps: int) -> None:
        """Tell the driver where rank 0's loader is: at most every PROGRESS_EVERY_S, and each epoch's end."""
        now = time.monotonic()
        if step < steps and now - self._progress_sent < PROGRESS_EVERY_S:
            return
        self._progress_sent = now
        self._reporter({**self._report_head(), PROGRESS_KEY: (epoch, step, steps)})

    def _report_head(self) -> Dict[str, Any]:
        return {"rank": self.rank, "attempt": self.attempt, "time": time.time()}  # REPORT_KEYS

    _progress_sent = 0.0

    # -- metrics ----------------------------------------------------------------------------------------
    def report(self, **metrics) -> None:
        """Send metrics to the driver: printed there and kept in the run's history (any rank may report)."""
        if self._reporter is not None:
            self._reporter({**self._report_head(), **metrics})

    # -- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint_path(self) -> str:
        if not self.checkpoint_dir:
            raise RuntimeError("this run has no checkpoint directory")
        return os.path.join(self.checkpoint_dir, CHECKPOINT_FILE)

    def save_checkpoint(self, obj) -> None:
        """Rank 0 writes ``obj`` with ``torch.save`` atomically (temp file, then rename: a crash mid-write
        never leaves a torn checkpoint); other ranks return at once."""
        if self.rank != 0:
            return
        import torch

        path = self._checkpoint_path()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load_checkpoint(self, default=None):
        """The latest checkpoint of this run (every rank reads it), or ``default`` when there is none."""
        import torch

        path = self._checkpoint_path()
        if not os.path.exists(path):
            return default
        return torch.load(path, map_location="cpu", weights_only=False)


def get_context() -> TrainContext:
    """The context of the rank this code runs in.

    Raises:
        RuntimeError: called outside a function run by ``Distributor.run``.
    """
    if _current is None:
        raise RuntimeError("get_context() works only inside a function run by spark_dist's Distributor.run()")
    return _current


def _set_context(ctx: Optional[TrainContext]) -> None:
    global _current
    _current = ctx


def log_to_driver(message) -> None:
    """Print ``message`` in the driver's output (a notebook cell), whatever ``log_ranks`` or
    ``driver_log_verbosity`` says: Databricks' ``sparkdl.horovod.log_to_driver``. Messages over 4000
    characters are cut there. Outside a run it prints here."""
    text = str(message)[:LOG_MESSAGE_CHARS]
    if _current is None or _current._reporter is None:
        print(text, flush=True)
    else:
        _current.report(**{LOG_KEY: text})
