"""Temporary directories named after the process that owns them, swept once that process is gone.

A rank's work directory (its launch data, result and failure files) and the driver's default dataset
cache are removed by their owner when it ends normally; but Spark kills a Python worker with SIGKILL when
an executor is lost or a job is cancelled, and a killed driver runs no ``atexit``. Each directory's name
carries its owner's pid (``spark_dist-<kind>-<pid>-<tag>-XXXX``), and the next process of ours that makes
one of that kind on the machine removes those whose owner no longer runs (only directories this user owns).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import List, Optional


def _pattern(kind: str):
    return re.compile(rf"^spark_dist-{re.escape(kind)}-(\d+)-")


def make(kind: str, tag: str = "", parent: Optional[str] = None) -> str:
    """A new owner-only directory ``<parent or temp dir>/spark_dist-<kind>-<pid>-<tag>-XXXX``, after sweeping
    the leftovers of dead processes of the same kind there."""
    parent = parent or tempfile.gettempdir()
    sweep(kind, parent)
    return tempfile.mkdtemp(prefix=f"spark_dist-{kind}-{os.getpid()}-{tag + '-' if tag else ''}", dir=parent)


def sweep(kind: str, parent: Optional[str] = None) -> List[str]:
    """Remove the ``kind`` directories in ``parent`` whose owner process is gone; returns their paths.
    Never raises: a directory that cannot be removed is left for the next sweep."""
    parent = parent or tempfile.gettempdir()
    pattern, gone = _pattern(kind), []
    try:
        names = os.listdir(parent)
    except OSError:
        return gone
    for name in names:
        match = pattern.match(name)
        if not match or _alive(int(match.group(1))):
            continue
        path = os.path.join(parent, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


__all__ = ["make", "sweep"]
