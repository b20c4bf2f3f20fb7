"""A rank's checkpoints of its run, behind ``TrainContext.save_checkpoint`` / ``load_checkpoint``: rank 0's
``torch.save`` file and the sharded ones (:mod:`.sharded_checkpoints`), and, just after a checkpoint, the stop
that lets an attempt end there when the driver asked the run to change size.

The two kinds live side by side in the run's directory; a load without live objects reads whichever is newer.
A resize stops the attempt only once its checkpoint is durable, so the next attempt resumes from it with no step
lost or repeated.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Mapping, Optional

from ..errors import CheckpointReadError
from ..wire.protocol import PREEMPTED
from . import checkpoint_dirs, retention

CHECKPOINT_FILE = "checkpoint.pt"  # rank 0's checkpoint in the run's directory
# The one it replaced: read when the latest was damaged after it was written (a checkpoint is never torn by a
# crash mid-write, but a disk or a copy can lose its end later).
PREVIOUS_FILE = "checkpoint.prev.pt"
_UNREADABLE = object()
log = logging.getLogger(__name__)


class RankCheckpoints:
    """One rank's checkpoints of one run.

    Args:
        checkpoint_dir: the run's directory as the driver named it (a given absolute path, or the default's
            name), ``None`` when the run has none (then a save or load raises ``RuntimeError``).
        rank, world_size: this rank's place in the attempt.
        send: sends a record to the driver (the context's report head added).
        metrics: the latest value of each metric this rank reported (the context's, kept up to date there).
        resize_reason: why the driver asks the run to change size now, or ``None`` (always ``None`` where the
            run is not watched); not given: never stop.
        initial_world_size: the run's ``num_processes``, which a grow deals the loaders' epochs out to.
        hear_preemption: the callbacks ``on_preemption`` registered, each run at most once.
    """

    def __init__(self, checkpoint_dir: Optional[str], rank: int, world_size: int, send: Callable[[dict], None],
                 metrics: Mapping[str, Any], resize_reason: Optional[Callable[[], Optional[str]]] = None,
                 initial_world_size: int = 0, hear_preemption: Optional[List[Callable[[str], None]]] = None):
        self.checkpoint_dir = checkpoint_dir
        self.rank, self.world_size = rank, world_size
        self._send, self._metrics = send, metrics
        self._resize_reason = resize_reason
        self._initial_world_size = initial_world_size
        self._hear_preemption = hear_preemption if hear_preemption is not None else []
        self._sharded_checkpoints = None

    # -- saving -----------------------------------------------------------------------------------------
    def save(self, obj, *, sharded: Optional[bool] = None, async_save: bool = False, keep: Optional[int] = None,
             metric: Optional[str] = None, mode: str = "min") -> None:
        """``TrainContext.save_checkpoint``: see there for what each argument does and what it raises."""
        if sharded is None:
            from .checkpoint_state import has_sharded_tensors

            sharded = has_sharded_tensors(obj)
        if not sharded:
            given = [name for name, value in (("async_save", async_save), ("keep", keep), ("metric", metric))
                     if value]
            if given:
                raise ValueError(f"save_checkpoint: {', '.join(given)} apply to sharded checkpoints; pass "
                                 "sharded=True (rank 0's checkpoint is one file, replaced by each save)")
            if self.rank != 0:
                return
            import torch

            with checkpoint_dirs.atomic_write(self._name(), CHECKPOINT_FILE, previous=PREVIOUS_FILE) as f:
                torch.save(obj, f)
            self._resize_here(obj)
            return
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"save_checkpoint: keep must be an integer >= 1, got {keep!r}")
        if mode not in retention.MODES:
            raise ValueError(f"save_checkpoint: mode must be 'min' or 'max', got {mode!r}")
        # The score is rank 0's (it alone writes the marker): the other ranks need not have reported the metric.
        metrics = self._metrics if self.rank == 0 else {}
        self._sharded().save(obj, async_save=async_save, keep=keep, metric=metric, metrics=metrics, mode=mode)
        self._resize_here(obj)

    def _resize_here(self, obj) -> None:
        """Rank 0, just after a checkpoint: stop here when the driver asked (an executor under a rank is being
        decommissioned, or an elastic run's missing slots are free), once the checkpoint is durable (the next
        attempt resumes from it; no step is lost or repeated). A grow waits for a checkpoint whose loaders'
        epochs deal out evenly to ``initial_world_size`` ranks (at most a step or two), so that no batch of the
        epoch is left out; a preemption does not wait.

        Raises:
            RunResized: the driver asked; the message says why.
        """
        if self._resize_reason is None or self.rank != 0:
            return
        reason = self._resize_reason()  # one store lookup
        if reason is not None and not reason.startswith(PREEMPTED):
            from ..data.read.dealt_epoch import deals_evenly, loader_states

            if not all(deals_evenly(state, self._initial_world_size) for state in loader_states(obj)):
                return
        if reason is not None:
            from ..errors import RunResized

            if reason.startswith(PREEMPTED):  # the callbacks' threads may not have looked since
                for hear in self._hear_preemption:
                    hear(reason[len(PREEMPTED):])
            self.wait()
            raise RunResized(reason)

    # -- loading ----------------------------------------------------------------------------------------
    def load(self, default=None, *, into=None):
        """``TrainContext.load_checkpoint``: see there for what it returns and raises."""
        if into is not None:
            restored = self._sharded().load_into(into)
            return default if restored is None else restored
        import torch

        from .sharded_checkpoints import load_full

        self.wait()
        latest_sharded = self._sharded().latest()
        f = checkpoint_dirs.open_checked(self._name(), CHECKPOINT_FILE)
        if f is None and latest_sharded is None:
            return default
        if f is not None and (latest_sharded is None or os.fstat(f.fileno()).st_mtime >= latest_sharded.time):
            return self._load_whole(f)
        if f is not None:
            f.close()
        return load_full(latest_sharded.path)

    def _load_whole(self, f):
        """Rank 0's checkpoint from the open file ``f``; when it cannot be read, the one before it, with a
        warning naming both.

        Raises:
            CheckpointReadError: neither can be read, naming the latest.
        """
        import torch

        with f:
            try:
                return torch.load(f, map_location="cpu", weights_only=False)
            except Exception as exc:  # noqa: BLE001 -- torch's errors for a damaged file vary: named below
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        path = os.path.join(checkpoint_dirs.resolve(self._name()), CHECKPOINT_FILE)
        before = checkpoint_dirs.open_checked(self._name(), PREVIOUS_FILE)
        if before is not None:
            state = _UNREADABLE
            with before:
                try:
                    state = torch.load(before, map_location="cpu", weights_only=False)
                except Exception:  # noqa: BLE001 -- damaged too: the error below names the latest
                    pass
            if state is not _UNREADABLE:
                log.warning("spark_dist: checkpoint %s cannot be read (%s): resuming from the one before it, %s",
                            path, reason, os.path.join(os.path.dirname(path), PREVIOUS_FILE))
                return state
        raise CheckpointReadError(path, reason)

    def wait(self) -> None:
        """Wait for this rank's asynchronous save in flight, if any; raise its error."""
        if self._sharded_checkpoints is not None:
            self._sharded_checkpoints.wait()

    def _name(self) -> str:
        if not self.checkpoint_dir:
            raise RuntimeError("this run has no checkpoint directory")
        return self.checkpoint_dir

    def _sharded(self):
        if self._sharded_checkpoints is None:
            from .sharded_checkpoints import ShardedCheckpoints

            self._sharded_checkpoints = ShardedCheckpoints(self._name(), self.rank, self.world_size, self._send)
        return self._sharded_checkpoints


__all__ = ["CHECKPOINT_FILE", "PREVIOUS_FILE", "RankCheckpoints"]
