"""The rank's view of its run: :class:`TrainContext` and :func:`get_context`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from . import checkpoint_dirs
from .checkpoints import CHECKPOINT_FILE, RankCheckpoints
from ..wire.protocol import LOG_KEY, PREEMPTED, REPORT_KEYS

_current: Optional["TrainContext"] = None

PROGRESS_EVERY_S = 0.25
LOG_MESSAGE_CHARS = 4000  # longer messages are cut, as Databricks' log_to_driver does
_LOADER_DEFAULT = object()  # an option left to make_loader's own default


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
    initial_world_size: int = 0  # the run's num_processes (an elastic run's attempt may have fewer ranks)
    previous_world_size: int = 0  # the ranks of the attempt before this one (0: this is the first)
    _watch_resize: bool = field(default=False, repr=False)  # rank 0 stops at a checkpoint when the driver asks
    # Counts and times this rank's steps (each batch of its loaders, or ctx.step()): see spark_dist.task.steps.
    step_clock: Any = field(default=None, repr=False)
    _hear_preemption: list = field(default_factory=list, repr=False)  # on_preemption's callbacks, each run once

    @property
    def preempted(self) -> bool:
        """Whether Spark is decommissioning an executor on a host of this run's ranks (a spot instance reclaimed,
        a node drained, a standalone worker's decommission script): save a checkpoint soon. Rank 0 stops at it
        (:class:`~spark_dist.errors.RunResized`) and the run goes on in a new attempt, on the executors left
        or new ones. Read from the driver at each access (one store lookup); ``False`` in local mode and
        under Spark Connect, where the driver cannot see decommissions."""
        return self._preemption() is not None

    def _preemption(self) -> Optional[str]:
        """Why the driver said this run is being preempted (the executors), else ``None``."""
        reason = self._resize_reason()
        return reason[len(PREEMPTED):] if reason is not None and reason.startswith(PREEMPTED) else None

    def _resize_reason(self) -> Optional[str]:
        """Why the driver asks this run to change size now (one store lookup), else ``None``; always ``None``
        where the run is not watched."""
        if not self._watch_resize or self._reporter is None:
            return None
        return self._reporter.resize_reason()

    def on_preemption(self, callback, every: float = 1.0) -> None:
        """Call ``callback(reason)`` once when :attr:`preempted` becomes true: from a background thread that
        checks every ``every`` seconds, or in rank 0 from :meth:`save_checkpoint` if that stops the attempt
        first. It runs beside the training loop: let it set a flag the loop reads (and checkpoints on), not
        train or save itself."""
        import threading

        if not self._watch_resize or self._reporter is None:
            return
        once = threading.Lock()  # taken for good by the first of the two callers

        def hear(reason):
            if once.acquire(blocking=False):
                callback(reason)

        def watch():
            while (reason := self._preemption()) is None:
                time.sleep(every)
            hear(reason)

        self._hear_preemption.append(hear)
        threading.Thread(target=watch, name="spark_dist-preemption", daemon=True).start()

    @property
    def resized(self) -> bool:
        """Whether this attempt runs on another number of ranks than the attempt before it (an elastic run,
        ``min_processes``): rescale what depends on the world size, e.g. the learning rate by
        ``world_size / initial_world_size`` (Goyal et al.'s linear rule, as ``spark_dist.ml`` does)."""
        return bool(self.previous_world_size) and self.previous_world_size != self.world_size

    @property
    def device(self):
        """``cuda:LOCAL_RANK`` when the run uses GPUs (CUDA_VISIBLE_DEVICES lists this host's task GPUs in
        local-rank order), else ``cpu``."""
        import torch

        return torch.device(f"cuda:{self.local_rank}") if self.use_gpu else torch.device("cpu")

    _deepspeed_config = None  # set in the rank by spark_dist/task/deepspeed_args.py

    @property
    def deepspeed_config(self) -> Optional[Dict[str, Any]]:
        """The config a :class:`~spark_dist.DeepspeedTorchDistributor` run was given (its ``deepspeedConfig``,
        a dict or the file's content), a fresh copy on each read, ready for ``deepspeed.initialize(...,
        config=ctx.deepspeed_config)``; ``None`` without one or in other runs. ``sys.argv`` holds
        ``--deepspeed --deepspeed_config FILE`` too, as PySpark gives it."""
        import copy

        return copy.deepcopy(self._deepspeed_config)

    # -- data -------------------------------------------------------------------------------------------
    def loader(self, name: str, batch_size: int, *, epoch: int = 0, shuffle: bool = True, seed: int = 0,
               columns=None, drop_last: bool = True, dtypes=None, pad=None, pad_side: str = "right", ragged=(),
               shapes=None, transform=None, workers: int = 0, collate=None, timeout=_LOADER_DEFAULT):
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
        are reproducible and differ between ranks: each batch is transformed with ``random``, ``numpy.random`` and
        torch seeded from ``(seed, epoch, rank, batch)``, the rank and batch it was made for (after a resize, a
        batch dealt to another rank keeps its seed). A transform's exception is raised here as a
        ``TransformError`` (a ``DatasetError``) naming the dataset, epoch and batch, with the worker's traceback;
        so is a batch a worker spends more than ``timeout`` seconds on (default 600, ``None``: no limit), naming
        the worker.

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
        from ..data import make_loader

        loader = make_loader(self.datasets[name], rank=self.rank, world_size=self.world_size,
                             batch_size=batch_size, epoch=epoch, shuffle=shuffle, seed=seed,
                             columns=columns, drop_last=drop_last, device=self.device if self.use_gpu else None,
                             dtypes=dtypes, pad=pad, pad_side=pad_side, ragged=ragged, shapes=shapes,
                             transform=transform, workers=workers, collate=collate,
                             **({} if timeout is _LOADER_DEFAULT else {"timeout": timeout}))
        loader.step_clock = self.step_clock
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

    def step(self) -> None:
        """Mark the end of a training step, where the loop has no loader from :meth:`loader` (whose batches are
        counted as steps by themselves: do not mark those). The driver watches the ranks' steps for a stall
        (``spark.dist.stallTimeout``) and times them for its summary: a run that counts no steps is not
        watched for stalls."""
        if self.step_clock is not None:
            self.step_clock.mark()

    # -- metrics ----------------------------------------------------------------------------------------
    def report(self, **metrics) -> None:
        """Send metrics to the driver: printed there and kept in the run's history (any rank may report)."""
        self._last_metrics.update(metrics)
        if self._reporter is not None:
            self._reporter({**self._report_head(), **metrics})

    # -- checkpoints ------------------------------------------------------------------------------------
    def __post_init__(self):
        self._last_metrics: Dict[str, Any] = {}  # the latest value of each metric this rank reported
        # The driver names the default directory (a relative name) for every host: this host's path is
        # under its own private temp dir. ``_checkpoint_name`` keeps the driver's form, which says which.
        self._checkpoint_name = self.checkpoint_dir
        if self.checkpoint_dir:
            self.checkpoint_dir = checkpoint_dirs.resolve(self.checkpoint_dir)

    def save_checkpoint(self, obj, *, sharded: Optional[bool] = None, async_save: bool = False,
                        keep: Optional[int] = None, metric: Optional[str] = None, mode: str = "min") -> None:
        """Save a checkpoint of this run, which a retry (or a resumed run) finds with :meth:`load_checkpoint`.

        - Rank 0's (``sharded=False``, the default for a state without DTensors): rank 0 writes ``obj`` with
          ``torch.save`` atomically (temp file, then rename: a crash mid-write never leaves a torn checkpoint);
          other ranks return at once.
        - Sharded (``sharded=True``, or a state holding DTensors: an FSDP2 ``fully_shard`` model): every rank
          calls it at the same point and writes its own shards through ``torch.distributed.checkpoint``; it
          counts once every rank's part is written and rank 0 committed it, so a run killed mid-save resumes
          from the previous one. ``obj`` is a dict that may hold the training's live objects, saved through
          torch's ``state_dict`` helpers: ``{"model": model, "optimizer": optimizer, "loader": loader,
          "step": step}`` (a module; an optimizer of that one module; anything with ``state_dict`` /
          ``load_state_dict``; tensors and plain values). ``async_save=True`` stages the state to CPU memory
          and writes it in the background; the next save or load, :meth:`wait_for_checkpoints`, the
          function's return and ``destroy_process_group`` wait for it. ``keep=k`` keeps the ``k`` latest
          checkpoints, or with ``metric`` (a name rank 0 reported with :meth:`report`; its latest value there is
          the checkpoint's score, and the other ranks need not report it) the ``k`` best (``mode`` ``"min"`` or
          ``"max"``; a NaN or infinite score ranks last), and always the latest; the driver's
          ``Distributor.best_checkpoint`` names the best. A sharded checkpoint in the default
          directory needs the ranks on one host; across hosts set ``spark.dist.checkpointDir`` to a shared
          filesystem.

        Rank 0 raises :class:`~spark_dist.errors.RunResized` from here when the driver asked the run to go on in
        a new attempt: an executor running a rank is being decommissioned (:attr:`preempted`), or an elastic run
        (``min_processes``) can grow back. The attempt ends at this checkpoint and the next resumes from it.

        Raises:
            RunResized: see above (a ``BaseException``: let it through).
            CheckpointDirError: (a ``PermissionError``) the checkpoint directory is not this user's alone:
                another owner, writable by group or others, a symbolic link, or under a directory others can
                write; the message names the path and ``spark.dist.checkpointDir`` (``checkpoint_dir=``).
            ValueError: ``async_save``, ``keep`` or ``metric`` with a rank-0 checkpoint; ``keep`` < 1; ``mode``
                neither ``"min"`` nor ``"max"``; ``metric`` never reported by rank 0, or not a number (raised on
                every rank alike); an optimizer in a sharded state beside no module or several.
            ConfigError: a sharded checkpoint in the default directory with ranks on several hosts.
            RuntimeError: a sharded checkpoint with several ranks and no ``torch.distributed`` process group.
        """
        started = time.perf_counter()
        self._checkpoints().save(obj, sharded=sharded, async_save=async_save, keep=keep, metric=metric, mode=mode)
        if self.step_clock is not None:  # the blocking part of the save: the run's checkpoint stall
            self.step_clock.saved(time.perf_counter() - started)

    def load_checkpoint(self, default=None, *, into=None):
        """The latest checkpoint of this run, or ``default`` when there is none.

        - ``into=`` the dict given to a sharded :meth:`save_checkpoint` (the same keys, the live objects of
          this attempt: an FSDP2 model wrapped as when it was saved, its optimizer, the loader): every rank
          calls it; its objects are restored in place from the latest sharded checkpoint, resharded to this
          run's number of ranks, and the dict is returned with its plain values (``"step"``) as saved;
          ``default`` when there is no sharded checkpoint.
        - Without ``into``: the latest of rank 0's checkpoint (unpickled with ``torch.load(weights_only=False)``
          only once it and its directory proved this user's alone) and the sharded ones, a sharded one read
          whole (every tensor complete, on this rank alone).

        Raises:
            CheckpointDirError: (a ``PermissionError``) the checkpoint, its directory or a directory above it
                is not this user's alone; the message names the path and ``spark.dist.checkpointDir``
                (``checkpoint_dir=``).
            RuntimeError, ConfigError: as for a sharded :meth:`save_checkpoint`.
        """
        return self._checkpoints().load(default, into=into)

    def wait_for_checkpoints(self) -> None:
        """Wait for this rank's asynchronous save in flight, if any (every rank calls it: the save's commit
        waits on all of them); raises the save's error."""
        if self._rank_checkpoints is not None:
            self._rank_checkpoints.wait()

    def _checkpoints(self) -> RankCheckpoints:
        if self._rank_checkpoints is None:
            self._rank_checkpoints = RankCheckpoints(
                self._checkpoint_name, self.rank, self.world_size, self._send, self._last_metrics,
                resize_reason=self._resize_reason, initial_world_size=self.initial_world_size,
                hear_preemption=self._hear_preemption)
        return self._rank_checkpoints

    def _send(self, record: Dict[str, Any]) -> None:
        if self._reporter is not None:
            self._reporter({**self._report_head(), **record})

    _rank_checkpoints = None


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
