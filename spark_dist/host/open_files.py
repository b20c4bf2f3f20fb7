"""Whether the driver may open the files a run's store needs: each rank holds connections to it, and each
connection is an open file of the driver's process, counted against its ``RLIMIT_NOFILE`` soft limit.

A rank holds :data:`CONNECTIONS_PER_RANK` connections: its supervisor's, its supervisor's abort watch's (a wait
blocked in the store: ``wire/abort_watch.py``) and its rank process's reports. At the common soft limit of 1,024 a
driver serves about 330 ranks; past it the store refuses connections mid-rendezvous ("Too many open files") and
the run fails far from the cause. spark_dist never raises the limit itself: the process is the user's.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

CONNECTIONS_PER_RANK = 3
RESERVE = 64  # what else the driver opens while a run goes on: py4j's sockets, logs, a checkpoint being read


def limits() -> Optional[Tuple[int, int]]:
    """``(soft, hard)`` limits on this process's open files (hard ``-1``: unlimited); ``None`` where there is no
    soft limit, or the system cannot say."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else (soft, hard)


def open_now() -> int:
    """The files this process has open now (0 where the system cannot say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def shortfall(ranks: int) -> Optional[str]:
    """Why this process cannot hold the store connections of ``ranks`` ranks, ``None`` when it can: the files it
    would need and may open, and how to raise the limit."""
    limit = limits()
    if limit is None:
        return None
    soft, hard = limit
    needed = open_now() + CONNECTIONS_PER_RANK * ranks + RESERVE
    if needed <= soft:
        return None
    target = max(needed, 4096) if hard < 0 else min(max(needed, 4096), hard)
    fix = (f"raise it before starting Python (`ulimit -n {target}`), or in this process: "
           f"resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, {'resource.RLIM_INFINITY' if hard < 0 else hard}))")
    if 0 <= hard < needed:
        fix = ("the hard limit is too low as well: ask for a higher one (limits.conf, systemd's LimitNOFILE), "
               f"then {fix}")
    return (f"a run of {ranks} ranks needs about {needed:,} open files on the driver ({CONNECTIONS_PER_RANK} store "
            f"connections a rank, besides what it has open), but this process may open {soft:,} (RLIMIT_NOFILE "
            f"soft limit; hard limit {'unlimited' if hard < 0 else f'{hard:,}'}): {fix}")
