"""Sharded checkpoints: every rank writes its own shards through ``torch.distributed.checkpoint`` (DCP).

A run's sharded checkpoints are numbered directories ``<run's checkpoint dir>/sharded/<seq>/`` holding DCP's
files. One counts only once it is committed: after DCP's save returned on every rank (its coordinator, rank 0,
writes ``.metadata`` only once it has every rank's write results, and each file is synced), rank 0 writes
``COMMITTED.json`` into it, atomically (temp file, fsync, rename). A run killed mid-save leaves a directory
without the marker: loads skip it and the next commit removes it, so a resume always starts from the last
complete checkpoint, never a torn one.

- ``async_save``: DCP stages the state to CPU memory before ``save`` returns, then writes it in a background
  thread over a gloo group of its own (training's collectives keep the default group to themselves). The next
  save, a load, ``wait()``, the training function's return and ``destroy_process_group`` wait for it first.
- Retention (``keep=k``): after a commit, rank 0 removes the older checkpoints beyond the ``k`` latest, or,
  with a ``metric``, beyond the ``k`` best by their score; the latest is always kept, to resume from.
- Loading reshards: a checkpoint saved by ``n`` ranks loads on any number (DCP reads the pieces each rank's
  tensors need); without live objects to load into, :func:`load_full` reads every tensor whole, in one process.

DCP's ``.metadata`` and non-tensor items are unpickled on load, so a checkpoint is read only through
descriptors checked as this user's alone (:mod:`.sharded_files`, which also lists the committed ones and reads
one whole). Which are the best is :mod:`.retention`'s ranking, the one the driver's ``best_checkpoint`` uses.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from ..config import CONF_CHECKPOINT_DIR
from ..errors import ConfigError, DiskFullError
from ..host import disk_space
from . import checkpoint_dirs, checkpoint_state, retention
from .sharded_files import MARKER, SHARDED_DIR, Committed, committed, load_full, opened, sharded_root

CHECKPOINT_KEY = "_checkpoint"  # a report telling the driver of a committed (and of removed) checkpoints


class ShardedCheckpoints:
    """A rank's sharded checkpoints of one run (``ctx.save_checkpoint`` / ``ctx.load_checkpoint`` use it)."""

    def __init__(self, checkpoint_dir: str, rank: int, world_size: int, report: Callable[[dict], None]):
        self.checkpoint_dir = checkpoint_dir  # as the rank got it (a default's name, or a given absolute path)
        self.rank, self.world_size = rank, world_size
        self._report = report
        self._group = None  # the gloo group DCP's collectives use
        self._checked_hosts = False
        self._pending = None  # (future, seq, path, marker) of an async save not yet waited for
        self._committed_lock = threading.Lock()
        self._committed_seqs: set = set()
        self._retain: Optional[tuple] = None  # (keep, mode) asked with the last save
        self._told_kept = False  # rank 0 told the driver every checkpoint it kept, those of earlier runs included

    # -- saving -----------------------------------------------------------------------------------------
    def save(self, state: Mapping[str, Any], *, async_save: bool = False, keep: Optional[int] = None,
             metric: Optional[str] = None, metrics: Optional[Mapping[str, Any]] = None, mode: str = "min") -> None:
        """Save ``state`` (live objects, see :mod:`checkpoint_state`) as the next sharded checkpoint; every rank
        calls it at the same point of training. With ``metric``, the checkpoint's score is its latest value in
        rank 0's ``metrics`` (the other ranks' are not read).

        Raises:
            ValueError: rank 0 never reported ``metric``, or not as a number: raised on every rank alike.
            DiskFullError: the checkpoint's filesystem is full (its partial directory removed; the checkpoint
                before it intact). An ``async_save``'s is raised by the next save, load or wait.
        """
        import torch.distributed.checkpoint as dcp

        self.wait()
        saved = checkpoint_state.to_saved(state)
        group, no_dist = self._dcp_group()
        seq, score = self._next_seq(group, metric, metrics or {})
        path = os.path.join(sharded_root(self.checkpoint_dir), f"{seq:08d}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        marker = {"seq": seq, "world_size": self.world_size, "metric": metric, "score": score}
        self._retain = (keep, mode)
        if not async_save:
            with self._disk_full_said(path):
                dcp.save(saved, checkpoint_id=path, process_group=group, no_dist=no_dist)
            self._commit(seq, path, marker)
            self._after_commit()
            return
        future = dcp.async_save(saved, checkpoint_id=path, process_group=group, no_dist=no_dist)
        if not hasattr(future, "add_done_callback"):  # an AsyncSaveResponse (a stager of one's own)
            future = future.upload_completion
        self._pending = (future, seq, path, marker)
        if self.rank == 0:  # durable as soon as written, whether or not the training gets to wait for it
            future.add_done_callback(
                lambda f: f.exception() is None and self._commit(seq, path, marker))

    def wait(self) -> None:
        """Wait for the async save in flight, if any; raise its error."""
        if self._pending is None:
            return
        future, seq, path, marker = self._pending
        self._pending = None
        with self._disk_full_said(path):
            future.result()
        self._commit(seq, path, marker)
        self._after_commit()

    @contextlib.contextmanager
    def _disk_full_said(self, path: str) -> Iterator[None]:
        """A write of checkpoint ``path`` that fills its filesystem ends in a :class:`DiskFullError` saying so in
        words (torch says "file write failed" or wraps each rank's error); rank 0 removes the partial directory,
        which no marker will ever commit."""
        try:
            yield
        except BaseException as exc:
            if not disk_space.ran_out_of_space(exc, os.path.dirname(path)):
                raise
            if self.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            raise DiskFullError(os.path.dirname(path), f"sharded checkpoint {os.path.basename(path)}",
                                disk_space.free_bytes(os.path.dirname(path))) from exc

    def _commit(self, seq: int, path: str, marker: Dict[str, Any]) -> None:
        if self.rank != 0:
            return
        with self._committed_lock:
            if seq in self._committed_seqs:
                return
            tmp = os.path.join(path, f".{MARKER}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with open(fd, "w") as f:
                json.dump({**marker, "time": time.time()}, f)
                f.flush()
                os.fsync(f.fileno())
            for name in os.listdir(path):  # DCP writes with the umask's mode: none may stay writable by others
                st = os.lstat(os.path.join(path, name))
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o022:
                    os.chmod(os.path.join(path, name), st.st_mode & ~0o022)
            os.replace(tmp, os.path.join(path, MARKER))
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self._committed_seqs.add(seq)

    def _after_commit(self) -> None:
        """Rank 0: remove what retention and torn saves leave, and tell the driver."""
        if self.rank != 0:
            return
        keep, mode = self._retain or (None, "min")
        kept = committed(self.checkpoint_dir)
        if not kept:
            return
        latest = kept[-1]
        retained = {c.seq for c in retention.retained(kept, keep, mode, score=lambda c: c.score)}
        removed = [c.path for c in kept if c.seq not in retained]
        root = sharded_root(self.checkpoint_dir)
        torn = [os.path.join(root, n) for n in os.listdir(root)
                if n.isdigit() and int(n) < latest.seq and not os.path.exists(os.path.join(root, n, MARKER))]
        for path in removed + torn:
            shutil.rmtree(path, ignore_errors=True)
        told = {"path": latest.path, "seq": latest.seq, "metric": latest.metric, "score": latest.score, "mode": mode,
                "removed": removed}
        if not self._told_kept:
            # The first commit of this process names every checkpoint kept: an earlier attempt's, or an earlier
            # run's under the same run_id (interrupted, then run again), may hold the best. Later ones tell
            # what changed, so a long run's reports stay small.
            told["kept"] = [{"path": c.path, "seq": c.seq, "metric": c.metric, "score": c.score}
                            for c in kept if c.seq in retained]
            self._told_kept = True
        self._report({CHECKPOINT_KEY: told})

    def _next_seq(self, group, metric: Optional[str], metrics: Mapping[str, Any]) -> tuple:
        """``(seq, score)`` of the next save, as rank 0 sees them: one past the highest numbered directory, and
        rank 0's value of ``metric`` (``None`` without one). The others take its word, or its refusal of the
        metric, which every rank raises alike: none is left waiting in a collective for a rank that gave up.

        Raises:
            ValueError: rank 0 has no number for ``metric`` (see :func:`retention.score_of`).
        """
        answer: List[Any] = [None]
        if self.rank == 0:
            try:
                score = None if metric is None else retention.score_of(metric, metrics, self.rank)
            except ValueError as exc:
                answer[0] = str(exc)
            else:
                root = sharded_root(self.checkpoint_dir)
                checkpoint_dirs.check_dir(self.checkpoint_dir, create=True)
                os.makedirs(root, mode=0o700, exist_ok=True)
                answer[0] = (1 + max((int(n) for n in os.listdir(root) if n.isdigit()), default=0), score)
        if group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list(answer, src=0, group=group)
        if isinstance(answer[0], str):
            raise ValueError(answer[0])
        return answer[0]

    def _dcp_group(self):
        """``(group, no_dist)`` for DCP: a gloo group of this run's ranks, made once (every rank makes it at
        its first sharded save or load, the same point of training), or no collectives for a lone rank.

        Raises:
            RuntimeError: several ranks, but torch.distributed is not initialised.
            ConfigError: the ranks are on several hosts and the checkpoint directory is the default, on each
                host's own disk (a sharded checkpoint needs one every rank sees).
        """
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            if self.world_size > 1:
                raise RuntimeError("sharded checkpoints need torch.distributed initialised on every rank: call "
                                   "dist.init_process_group() before save_checkpoint / load_checkpoint")
            return None, True
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        if not self._checked_hosts:
            import socket

            hosts: List[Optional[str]] = [None] * dist.get_world_size()
            dist.all_gather_object(hosts, socket.gethostname(), group=self._group)
            if len(set(hosts)) > 1 and checkpoint_dirs.is_default(self.checkpoint_dir):
                raise ConfigError(f"the ranks run on {len(set(hosts))} hosts, and a sharded checkpoint needs a "
                                  f"directory all of them see: set {CONF_CHECKPOINT_DIR} (checkpoint_dir=) to "
                                  "a shared filesystem")
            self._checked_hosts = True
        return self._group, False

    # -- loading ----------------------------------------------------------------------------------------
    def latest(self) -> Optional[Committed]:
        """The run's latest committed sharded checkpoint (as rank 0 sees it when ranks have a group)."""
        found = committed(self.checkpoint_dir)
        return found[-1] if found else None

    def load_into(self, state: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """Restore ``state``'s live objects from the latest committed checkpoint, resharded to this run's ranks;
        ``None`` when there is none. Every rank calls it at the same point."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        group, no_dist = self._dcp_group()
        choice = [None]
        if self.rank == 0 or group is None:
            latest = self.latest()
            choice[0] = None if latest is None else latest.path
        if group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list(choice, src=0, group=group)
        if choice[0] is None:
            return None
        from torch.distributed.checkpoint import FileSystemReader

        with opened(choice[0]) as where:  # each rank reads through its own checked descriptor
            reader = FileSystemReader(where)
            stored = reader.read_metadata().state_dict_metadata
            saved = checkpoint_state.to_saved(state, stored)
            _check_fits(choice[0], stored, state, saved)
            dcp.load(saved, storage_reader=reader, process_group=group, no_dist=no_dist)
        return checkpoint_state.restore(state, saved)


def _check_fits(path: str, stored: Mapping[str, Any], state: Mapping[str, Any], saved: Mapping[str, Any],
                shown: int = 3) -> None:
    """Raise before anything is loaded (so before a training step) when the checkpoint at ``path`` (its
    metadata's ``stored`` keys) does not fit ``state``: a key of the state it lacks, a module's key it holds
    that the module lacks, a tensor of another shape. DCP's own errors come mid-load, one key at a time.

    Raises:
        ConfigError: naming the first keys of each kind, the shapes, and what to change.
    """
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    planner = DefaultLoadPlanner()  # flattens the keys as the load will
    planner.set_up_planner(dict(saved))
    flat = planner.state_dict
    modules = [k for k, v in state.items() if isinstance(v, torch.nn.Module)]
    missing = [k for k in flat if k not in stored]
    unexpected = [k for k in stored if k not in flat and any(k.startswith(f"{m}.") for m in modules)]
    shapes = [f"{k} saved {list(stored[k].size)}, here {list(v.shape)}" for k, v in flat.items()
              if isinstance(stored.get(k), TensorStorageMetadata) and isinstance(v, torch.Tensor)
              and list(stored[k].size) != list(v.shape)]

    def first(keys):
        return ", ".join(keys[:shown]) + (f" (and {len(keys) - shown} more)" if len(keys) > shown else "")
    problems = [f"{what}: {first(keys)}" for what, keys in (
        ("not in the checkpoint", missing), ("in the checkpoint but not in the model", unexpected),
        ("of other shapes", shapes)) if keys]
    if problems:
        raise ConfigError(f"load_checkpoint(into=...): the checkpoint {path} does not fit the state given; "
                          + "; ".join(problems) + ". Build (and shard) the model as it was when saved, and pass "
                          "the keys the checkpoint holds")


__all__ = ["CHECKPOINT_KEY", "MARKER", "SHARDED_DIR", "Committed", "ShardedCheckpoints", "committed", "load_full",
           "sharded_root"]
