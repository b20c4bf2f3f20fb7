"""A run's sharded checkpoints on disk: where they live, which are committed, and a committed one opened and
read whole, each through descriptors checked by :mod:`spark_dist.host.ownership`.

``<run's checkpoint dir>/sharded/<seq>/`` holds DCP's files and, once committed, ``COMMITTED.json`` (the
marker: ``seq``, ``time``, ``world_size``, ``metric``, ``score``). DCP unpickles ``.metadata`` and non-tensor
items, so a checkpoint is read only once its directory, every directory above it and every file in it passed
the checks, and DCP then reads through the checked directory's descriptor (``/proc/self/fd/<n>``), never a path
that could have been swapped since. Only torch's public DCP API is used (``FileSystemReader.read_metadata``,
``load``, ``DefaultLoadPlanner``): its private helpers move between releases.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ..host import ownership
from . import checkpoint_dirs, checkpoint_state

log = logging.getLogger(__name__)

SHARDED_DIR = "sharded"
MARKER = "COMMITTED.json"
MARKER_FIELDS = ("time", "world_size")  # what a marker must hold besides its directory's number
_warned: set = set()  # the checkpoints skipped with a warning already: each is named once per process
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class Committed:
    """A committed sharded checkpoint: its number, directory, commit time and score (``None`` without a metric)."""

    seq: int
    path: str
    time: float
    world_size: int
    metric: Optional[str] = None
    score: Optional[float] = None


def sharded_root(checkpoint_dir: str) -> str:
    """``<run's checkpoint dir on this host>/sharded``."""
    return os.path.join(checkpoint_dirs.resolve(checkpoint_dir), SHARDED_DIR)


def committed(checkpoint_dir: str) -> List[Committed]:
    """The run's committed sharded checkpoints on this host, oldest first. A numbered directory or marker that
    is not this user's alone is not one; nor is one whose marker is torn or lacks a field (an older version's,
    or one made by hand): each is left out, and on disk, with a warning.

    Raises:
        CheckpointDirError: the run's directory or its ``sharded`` directory is not this user's alone (a link,
            another owner, writable by others, under a directory others can write).
    """
    run_fd = checkpoint_dirs.open_run_dir(checkpoint_dir)
    if run_fd is None:
        return []
    root = sharded_root(checkpoint_dir)
    try:
        with checkpoint_dirs.explained():
            root_fd = ownership.open_dir(root, parent_fd=run_fd)
    finally:
        os.close(run_fd)
    if root_fd is None:
        return []
    try:
        found = [_committed(root_fd, root, name) for name in os.listdir(root_fd) if name.isdigit()]
    finally:
        os.close(root_fd)
    return sorted((c for c in found if c is not None), key=lambda c: c.seq)


@contextlib.contextmanager
def opened(path: str) -> Iterator[str]:
    """The committed sharded checkpoint at ``path``, checked and held open: yields a path that names the
    checked directory itself, for DCP to read from.

    Raises:
        CheckpointDirError: the checkpoint's directory, a directory above it or a file in it is not this
            user's alone.
        FileNotFoundError: ``path`` is not a committed checkpoint.
    """
    path = os.path.abspath(path)
    with checkpoint_dirs.explained():
        fd = ownership.open_dir(path)
        if fd is None:
            raise FileNotFoundError(f"{path}: no such sharded checkpoint on this host")
        try:
            marker = ownership.open_file(fd, MARKER, os.path.join(path, MARKER))
            if marker is None:
                raise FileNotFoundError(f"{path} is not a committed sharded checkpoint (no {MARKER})")
            os.close(marker)
            ownership.check_files(fd, path)
            yield ownership.fd_path(fd, path)
        finally:
            os.close(fd)


def load_full(path: str) -> Dict[str, Any]:
    """Every tensor of the sharded checkpoint at ``path`` whole, read in this process alone (no process group):
    for inference, or to turn a sharded checkpoint into a ``torch.save`` one.

    Raises:
        CheckpointDirError: the checkpoint's directory, a directory above it or a file in it is not this user's
            alone.
        FileNotFoundError: ``path`` is not a committed checkpoint.
    """
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    with opened(path) as where:
        reader = FileSystemReader(where)
        metadata = reader.read_metadata()
        # DCP's flat keys, each tensor allocated whole as saved: DCP fills them (resharding whatever wrote them)
        # and replaces each other item with what it unpickles.
        flat: Dict[str, Any] = {
            key: torch.empty(md.size, dtype=md.properties.dtype) if isinstance(md, TensorStorageMetadata) else None
            for key, md in metadata.state_dict_metadata.items()}
        planner = DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)
        with warnings.catch_warnings():  # a process alone is what is asked for here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(flat, storage_reader=reader, planner=planner, no_dist=True)
    state = _nested(flat, metadata.planner_data or {})
    return {key: checkpoint_state.unpickled_state(value) for key, value in state.items()}


def _committed(root_fd: int, root: str, name: str) -> Optional[Committed]:
    """The checkpoint ``name`` in the checked ``root`` (open as ``root_fd``) if committed, with its marker's
    fields; ``None`` (and a warning) for one that is not ours alone or whose marker cannot be used."""
    path = os.path.join(root, name)
    try:
        fd = ownership.open_dir(path, parent_fd=root_fd)
        if fd is None:
            return None
        try:
            marker_fd = ownership.open_file(fd, MARKER, os.path.join(path, MARKER))
        finally:
            os.close(fd)
    except ownership.NotOwnedError as exc:
        _skip(path, f"{exc}: it is not this user's alone")
        return None
    if marker_fd is None:  # not committed: being written, or torn (the next commit removes it)
        return None
    with open(marker_fd) as f:
        try:
            marker = json.load(f)
        except ValueError:
            _skip(path, f"its {MARKER} is not JSON")
            return None
    missing = [k for k in MARKER_FIELDS if k not in marker] if isinstance(marker, dict) else list(MARKER_FIELDS)
    if missing:
        _skip(path, f"its {MARKER} lacks {', '.join(missing)} (an older version's, or made by hand)")
        return None
    try:
        score = marker.get("score")
        return Committed(int(name), path, float(marker["time"]), int(marker["world_size"]), marker.get("metric"),
                         None if score is None else float(score))
    except (TypeError, ValueError) as exc:
        _skip(path, f"its {MARKER} holds a field of another type ({exc})")
        return None


def _skip(path: str, why: str) -> None:
    """Warn, once per process and checkpoint, that the checkpoint at ``path`` is skipped as torn."""
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("spark_dist: the sharded checkpoint %s is skipped as torn (neither loaded nor removed): %s",
                path, why)


def _nested(flat: Mapping[str, Any], paths: Mapping[str, Any]) -> Dict[str, Any]:
    """``flat`` (DCP's keys) nested again along each key's object path, as DCP's default save planner records
    them in the metadata's ``planner_data``; a key without one stays as it is."""
    nested: Dict[str, Any] = {}
    for key, value in flat.items():
        path = paths.get(key)
        if isinstance(path, (tuple, list)) and path:
            _put(nested, tuple(path), value)
        else:
            nested[key] = value
    return nested


def _put(root: Dict[str, Any], path: tuple, value: Any) -> None:
    """Set ``value`` at ``path`` (keys of dicts, indexes of lists) under ``root``, making what is missing."""
    node: Any = root
    for step, after in zip(path, path[1:]):
        empty: Any = [] if isinstance(after, int) else {}
        if isinstance(node, list):
            node.extend([None] * (step + 1 - len(node)))
            if node[step] is None:
                node[step] = empty
            node = node[step]
        else:
            node = node.setdefault(step, empty)
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


__all__ = ["MARKER", "SHARDED_DIR", "Committed", "committed", "load_full", "opened", "sharded_root"]
