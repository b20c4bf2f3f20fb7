"""Temporary directories held by the process that made them, swept once no process holds them.

A rank's work directory (its launch data, result and failure files) and the driver's default dataset
cache are removed by their owner when it ends normally; but Spark kills a Python worker with SIGKILL when
an executor is lost or a job is cancelled, and a killed driver runs no ``atexit``. So the next process of
ours that makes a directory of the same kind on the machine removes the leftovers (only directories this
user owns).

Whether a directory is left over is decided by a lock, not by a pid: its owner holds an exclusive
``flock`` on the file ``.owner`` inside it for as long as the directory lives, and the kernel drops that
lock when the last descriptor of it closes, however the process ended. A sweep deletes a directory only
after taking that lock itself, without waiting. A pid would not do: a process in another PID namespace (a
container, a network namespace with its own /proc) has a pid that does not exist here, or belongs to
someone else here. The name still carries the pid (``spark_dist-<kind>-<pid>-<tag>-XXXX``), to tell a
reader whose directory it is.

A child forked by the owner (a DataLoader worker, a ``multiprocessing`` fork) inherits the lock's
descriptor, so the directory outlives the owner until the last such child ends: the child runs the owner's
code, knows the path and may still write there. A program started by ``exec`` does not inherit it
(the descriptor is close-on-exec), as it would otherwise keep directories it knows nothing about.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import tempfile
import threading
from typing import Dict, List, Optional

LOCK_NAME = ".owner"
_ATTEMPTS = 5  # tries at making a locked directory while sweeps race us for it (each lost try: a new name)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}  # a file system without flock

_lock = threading.Lock()
_held: Dict[str, int] = {}  # directory -> descriptor of its locked .owner file, for this process's directories


def _pattern(kind: str):
    return re.compile(rf"^spark_dist-{re.escape(kind)}-(\d+)-")


def make(kind: str, tag: str = "", parent: Optional[str] = None) -> str:
    """A new owner-only directory ``<parent or temp dir>/spark_dist-<kind>-<pid>-<tag>-XXXX``, locked by this
    process until it is removed (or the process ends), after sweeping the leftovers of the same kind there.

    Raises:
        OSError: ``parent`` cannot hold a new directory (missing, not writable). On a file system without
            ``flock`` the directory is made unlocked, and no sweep removes it (its owner still does).
    """
    parent = parent or tempfile.gettempdir()
    _release_removed()
    sweep(kind, parent)
    prefix = f"spark_dist-{kind}-{os.getpid()}-{tag + '-' if tag else ''}"
    for _ in range(_ATTEMPTS):
        path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        fd = _lock_new(path)
        if fd is not None:
            with _lock:
                _held[path] = fd
            return path
    raise OSError(f"could not hold a lock on a new directory in {parent} ({_ATTEMPTS} tries: each was swept "
                  "before its lock was taken)")


def _lock_new(path: str) -> Optional[int]:
    """The descriptor of ``path``'s ``.owner`` file, locked; ``None`` when a sweep took the new directory first.

    Between ``mkdtemp`` and the lock another process's sweep may find the directory unlocked and delete it:
    the lock counts only while the file locked is still the one at the path, which is checked after locking.
    """
    lock_path = os.path.join(path, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:  # swept already
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, lock_path):
            return fd
    except BlockingIOError:  # a sweep holds it, and is deleting the directory
        pass
    except OSError as exc:
        if exc.errno in _NO_FLOCK:  # no sweep can take a lock here either: the directory is never swept
            return fd
        os.close(fd)
        raise
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove(path: str) -> None:
    """Remove ``path`` (one :func:`make` returned) and drop this process's lock on it. Never raises."""
    shutil.rmtree(path, ignore_errors=True)
    release(path)


def release(path: str) -> None:
    """Drop this process's lock on ``path`` (one :func:`make` returned), e.g. right after removing it. A
    directory removed without this call has its lock dropped by the next :func:`make` of this process."""
    with _lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def _release_removed() -> None:
    """Close the locks of this process's directories that are gone (their owners removed them by path)."""
    with _lock:
        gone = [path for path in _held if not os.path.isdir(path)]
        fds = [_held.pop(path) for path in gone]
    for fd in fds:
        os.close(fd)


def sweep(kind: str, parent: Optional[str] = None) -> List[str]:
    """Remove the ``kind`` directories in ``parent`` that no process holds; returns their paths.
    Never raises: a directory that cannot be removed is left for the next sweep."""
    parent = parent or tempfile.gettempdir()
    pattern, gone = _pattern(kind), []
    try:
        names = os.listdir(parent)
    except OSError:
        return gone
    for name in names:
        match = pattern.match(name)
        path = os.path.join(parent, name)
        if match and _ours(path) and _remove_if_unheld(path, int(match.group(1))):
            gone.append(path)
    return gone


def _ours(path: str) -> bool:
    """A directory (not a link to one) of this user's."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return info.st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path)


def _remove_if_unheld(path: str, pid: int) -> bool:
    """Delete ``path`` while holding its lock; ``False`` (and nothing deleted) when some process holds it.

    A directory without a ``.owner`` file was made by a spark_dist from before the lock, or is being made
    right now: it is kept while its pid runs here, the only sign such a directory has.
    """
    lock_path = os.path.join(path, LOCK_NAME)
    if not os.path.lexists(lock_path) and _alive(pid):
        return False
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:  # gone meanwhile, or not ours to write
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner (or a child it forked) is alive, wherever its pid lives; or no flock here
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


__all__ = ["make", "release", "sweep", "LOCK_NAME"]


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``, owner-only and atomic: a process killed mid-write leaves no half file for
    its reader (a rank's supervisor) to read."""
    partial = path + ".partial"
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(data)
    os.replace(partial, path)
