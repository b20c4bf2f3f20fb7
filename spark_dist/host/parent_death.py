"""A child process that dies with its parent: what every process spark_dist forks or spawns on a host (ranks,
transform workers) asks for first, so that a killed Spark worker or rank leaves nothing of ours behind."""
from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent exits (``PR_SET_PDEATHSIG``); nothing elsewhere.

    The kernel sends the signal when the *thread* that created this process exits, not the whole parent: a
    process started from a short-lived thread needs another way to notice its parent's end as well.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: not Linux
        pass
