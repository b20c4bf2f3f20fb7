"""Whether a failed write ran out of disk space: the filesystem's own answer, not an error's wording alone.

A full disk reaches a writer in many shapes: an ``OSError`` with ``ENOSPC`` (or ``EDQUOT``, a quota), torch's
``PytorchStreamWriter failed writing file ...: file write failed`` (the errno lost on the way), or
``torch.distributed.checkpoint``'s ``CheckpointException`` carrying each rank's error as text. So the failed
write's own directory is asked how much room is left, and an error that says "no space" is believed as well.
"""
from __future__ import annotations

import errno
import os
from typing import Optional, Union

# Below this a write of any checkpoint fails: the filesystem's reserve and its last partial block.
_NEARLY_FULL_BYTES = 1 << 20
_SAYS_FULL = ("No space left on device", "Disk quota exceeded")


def free_bytes(where: Union[int, str]) -> Optional[int]:
    """The bytes an unprivileged writer may still use on the filesystem of ``where`` (a path or an open
    descriptor); ``None`` when the system cannot say."""
    try:
        info = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def ran_out_of_space(exc: BaseException, where: Union[int, str]) -> bool:
    """Whether ``exc``, raised while writing under ``where``, comes from a full filesystem (or quota)."""
    for cause in _chain(exc):
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(words in str(cause) for words in _SAYS_FULL):
            return True
    free = free_bytes(where)
    interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))
    return free is not None and free < _NEARLY_FULL_BYTES and not interrupted


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
