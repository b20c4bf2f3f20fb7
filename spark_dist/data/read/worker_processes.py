"""The transform workers' processes seen from the rank: start them, stop them, and say how one ended.

The rank starts one fresh interpreter, worker 0, which forks the others (:mod:`.transform_process`); each
worker has its own Unix socket to the rank. :class:`~.transform_workers.TransformWorkers` owns what
:func:`start` returns and hands it to :func:`stop`.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Tuple

from .transform_process import BOOT, forked_exit_code

STOP_GRACE_S = 5.0  # how long workers get to exit on end of file before they are killed


def start(count: int) -> Tuple[subprocess.Popen, List[socket.socket]]:
    """Start ``count`` workers: worker 0's process, and the rank's end of each worker's socket (worker 0's
    first). Raises ``OSError`` when the process cannot be started (no socket is left open then)."""
    pairs = [socket.socketpair() for _ in range(count)]
    theirs = [pair[1] for pair in pairs]
    try:
        # The kernel's parent-death signal follows the creating thread: only ask for it from the main one.
        on_main = threading.current_thread() is threading.main_thread()
        fds = [sock.fileno() for sock in theirs]
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, ",".join(map(str, fds)), str(os.getpid()), "1" if on_main else "0",
             json.dumps([str(p) for p in sys.path])],
            pass_fds=fds, stdin=subprocess.DEVNULL)
    except BaseException:
        for mine, _ in pairs:
            mine.close()
        raise
    finally:
        for sock in theirs:
            sock.close()
    return proc, [mine for mine, _ in pairs]


def stop(owner: int, procs: List[subprocess.Popen], socks: List[socket.socket]) -> None:
    """Stop the workers: end of file on their sockets makes each exit at once, even mid-transform (see
    transform_process._receive); one still alive after the grace period is killed. Joins them all.

    In a fork of the rank (``owner`` is not this process) it only closes its copies of the sockets: the
    workers are the rank's, not this process's children."""
    if os.getpid() != owner:
        for sock in socks:
            sock.close()
        procs.clear()
        socks.clear()
        return
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # end of file even if a fork of the rank holds a copy of the socket
        except OSError:
            pass
        sock.close()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    procs.clear()
    socks.clear()


def how_it_ended(first: subprocess.Popen, w: int, pid: Optional[int]) -> Tuple[Optional[int], str]:
    """``(pid, how it ended)`` of worker ``w`` (process ``pid``, None if it never said), whose socket closed:
    its exit code or signal once it shows, waiting up to the grace period. ``first`` is worker 0's process;
    a worker that died with it is described as worker 0."""
    code = None
    if w == 0 or first.poll() is not None:
        pid = first.pid
        try:
            code = first.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    elif pid is not None:
        code = forked_exit_code(pid, STOP_GRACE_S)
    if code is None:
        return pid, "closed its connection"
    if code < 0:
        return pid, f"was killed by signal {-code}" + (" (SIGKILL: often the out-of-memory killer)" if code == -9
                                                       else "")
    return pid, f"exited with code {code}"
