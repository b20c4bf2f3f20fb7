"""The rank's view of its run: :class:`TrainContext` and :func:`get_context`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .task import checkpoint_dirs

_current: Optional["TrainContext"] = None

CHECKPOINT_FILE = "checkpoint.pt"
REPORT_KEYS = ("rank", "attempt", "time")  # what every report carries besides the user's metrics
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
    checkpoint_dir: Optional[str] = None  # this host's path of the run's checkpoint directory
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
               columns=None, drop_last: bool = True, dtypes=None, pad=None, pad_side: str = "right", ragged=(),
               shapes=None, transform=None, workers: int = 0, collate=None):
        """This rank's equal shard of dataset ``name`` as batches (dicts of column -> tensor, or list).

        Every rank yields the same number of batches; the order depends only on ``(seed, epoch)``. What a batch
        holds of each column kind (the options as :func:`spark_dist.data.make_loader` takes them):

        - numbers ``[batch]``; arrays of one length and ML vectors ``[batch, length]``; nested arrays
          ``[batch, *shape]``; ``shapes={"pixels": (3, 8, 8)}`` reshapes an array, vector or nested column;
          ``dtypes={"x": torch.float64}`` overrides the dtype (default float32, int64, bool);
        - arrays of numbers of varying length: padded ``[batch, longest in the batch]`` with ``pad`` (a number, or
          column -> number; default 0) on ``pad_side`` (``"right"`` or ``"left"``), plus the int64 lengths under
          ``"<column>_lengths"``; or, for the columns in ``ragged``, a list of 1-D tensors;
        - ``binary``: a list of ``bytes``; ``string``: a list of ``str``.

        ``transform`` (a function of a batch, returning a dict of tensors: decode JPEGs with PIL, tokenize text,
        augment) runs on every batch in ``workers`` worker processes (fresh interpreters, never a fork of this
        rank; ``0`` runs it in the loader's thread), a bounded number of batches in flight, in the loader's
        order; ``collate`` turns what it returns into the batch where a dict does not fit. Random augmentations
        are reproducible: each batch is transformed with ``random``, ``numpy.random`` and torch seeded from
        ``(seed, epoch, batch)``. A transform's exception is raised here as a ``TransformError`` (a
        ``DatasetError``) naming the dataset, epoch and batch, with the worker's traceback.

        ``loader.set_epoch(e)`` (Lightning calls ``loader.sampler.set_epoch``) picks the epoch; ``loader.state_dict()``
        and ``loader.load_state_dict(state)`` save and restore the place in an epoch with a checkpoint, so a
        retried or resumed run goes on at the exact next batch::

            loader = ctx.loader("train", batch_size=64)
            state = ctx.load_checkpoint()
            if state is not None:
                model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
                loader.load_state_dict(state["loader"])  # also sets loader.epoch
            for epoch in range(loader.epoch, epochs):
                loader.set_epoch(epoch)  # keeps the restored place in its own epoch
                for batch in loader:
                    ...  # a step; every k batches, mid-epoch:
                    ctx.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                         "loader": loader.state_dict()})

        Raises:
            KeyError: ``name`` was not passed in ``datasets=`` to ``run()`` (the message lists those given).
            ValueError: ``batch_size`` < 1, ``workers`` < 0, ``collate`` without ``transform``, or ``pad_side``
                neither ``"right"`` nor ``"left"``.
            TransformError: ``transform`` failed on a batch (raised while iterating).
            DatasetError: a column in ``columns``, ``dtypes``, ``pad``, ``ragged`` or ``shapes`` that the dataset
                does not have or that the option does not apply to, a shape of another size than the column's,
                or fewer rows per rank than ``batch_size`` with ``drop_last=True``.
        """
        if name not in self.datasets:
            given = ", ".join(sorted(self.datasets)) or "none"
            raise KeyError(f"dataset {name!r} was not given to run(datasets=...); given: {given}")
        from .data import make_loader

        loader = make_loader(self.datasets[name], rank=self.rank, world_size=self.world_size,
                             batch_size=batch_size, epoch=epoch, shuffle=shuffle, seed=seed,
                             columns=columns, drop_last=drop_last, device=self.device if self.use_gpu else None,
                             dtypes=dtypes, pad=pad, pad_side=pad_side, ragged=ragged, shapes=shapes,
                             transform=transform, workers=workers, collate=collate)
        if self.rank == 0 and self._reporter is not None:  # the driver's progress bar follows rank 0's loader
            loader.on_progress = self._progress
        self.loaders.append(loader)
        return loader

    def _progress(self, epoch: int, step: int, steps: int) -> None:
        """Tell the driver where rank 0's loader is and how fast it goes, measured here: at most every
        PROGRESS_EVERY_S, and each epoch's end. One overwritten value, not a report: the driver shows the
        latest and keeps nothing. ``step`` k is handed out once k - 1 steps are done."""
        now = time.monotonic()
        if epoch != self._progress_epoch or step == 1:
            self._progress_epoch, self._progress_started = epoch, now
        if step < steps and now - self._progress_sent < PROGRESS_EVERY_S:
            return
        self._progress_sent = now
        elapsed = now - self._progress_started
        rate = (step - 1) / elapsed if step > 1 and elapsed > 0 else None
        # The driver reads the latest value only, so each value names the last epoch finished before this one.
        self._reporter.progress((epoch, step, steps, rate, self._progress_finished))
        if step >= steps:
            self._progress_finished = (epoch, steps, rate)

    def _report_head(self) -> Dict[str, Any]:
        return {"rank": self.rank, "attempt": self.attempt, "time": time.time()}  # REPORT_KEYS

    _progress_sent = 0.0
    _progress_epoch = None
    _progress_finished = None  # (epoch, steps, rate) of the last epoch rank 0 finished
    _progress_started = 0.0

    # -- metrics ----------------------------------------------------------------------------------------
    def report(self, **metrics) -> None:
        """Send metrics to the driver: printed there and kept in the run's history (any rank may report)."""
        if self._reporter is not None:
            self._reporter({**self._report_head(), **metrics})

    # -- checkpoints ------------------------------------------------------------------------------------
    def __post_init__(self):
        # The driver names the default directory (a relative name) for every host: this host's path is
        # under its own private temp dir. ``_checkpoint_name`` keeps the driver's form, which says which.
        self._checkpoint_name = self.checkpoint_dir
        if self.checkpoint_dir:
            self.checkpoint_dir = checkpoint_dirs.resolve(self.checkpoint_dir)

    def _checkpoint_dir(self) -> str:
        if not self._checkpoint_name:
            raise RuntimeError("this run has no checkpoint directory")
        return self._checkpoint_name

    def save_checkpoint(self, obj) -> None:
        """Rank 0 writes ``obj`` with ``torch.save`` atomically (temp file, then rename: a crash mid-write
        never leaves a torn checkpoint); other ranks return at once.

        Raises:
            CheckpointDirError: (a ``PermissionError``) the checkpoint directory is not this user's alone:
                another owner, writable by group or others, or a symbolic link; the message names
                ``spark.dist.checkpointDir`` (``checkpoint_dir=``).
        """
        if self.rank != 0:
            return
        import torch

        with checkpoint_dirs.atomic_write(self._checkpoint_dir(), CHECKPOINT_FILE) as f:
            torch.save(obj, f)

    def load_checkpoint(self, default=None):
        """The latest checkpoint of this run (every rank reads it), or ``default`` when there is none. It is
        unpickled (``torch.load(weights_only=False)``) only once it and its directory proved this user's alone.

        Raises:
            CheckpointDirError: (a ``PermissionError``) the checkpoint or its directory is not this user's
                alone; the message names ``spark.dist.checkpointDir`` (``checkpoint_dir=``).
        """
        import torch

        f = checkpoint_dirs.open_checked(self._checkpoint_dir(), CHECKPOINT_FILE)
        if f is None:
            return default
        with f:
            return torch.load(f, map_location="cpu", weights_only=False)


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
