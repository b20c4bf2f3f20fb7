"""Asking a rank process for its Python stack, every thread's: the rank registered faulthandler on SIGUSR1 with
a file in its work directory (:data:`spark_dist.task.rank_process.STACK_FILE`), and its supervisor asks when the
run timed out or the driver diagnoses a stall."""
from __future__ import annotations

import os
import signal
import time

from ..host import process_state
from ..wire.protocol import NO_STACK, STOPPED

STACK_CHARS = 8000  # of a rank's stack dump, the end (its innermost frames) is kept


def dump(pid: int, path: str) -> str:
    """Ask rank process ``pid`` for its Python stack (faulthandler on SIGUSR1, into ``path``) and return it; when
    it cannot answer, :data:`~spark_dist.wire.protocol.NO_STACK` and why (the driver then names this rank first)."""
    if process_state.stopped(pid):
        return f"{NO_STACK}{STOPPED}: it was sent SIGSTOP, or a debugger holds it)"
    try:
        os.truncate(path, 0)  # the rank appends: its dump starts the file
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    except OSError:  # no stack file: the rank has not got as far as making it
        return f"{NO_STACK}it was still starting)"
    deadline = time.monotonic() + 1.0
    seen = ""
    while time.monotonic() < deadline:  # until the dump stops growing
        time.sleep(0.05)
        text = _read_text(path)
        if text and text == seen:
            break
        seen = text
    return _read_text(path)[-STACK_CHARS:] or (f"{NO_STACK}it did not answer a request for its stack within "
                                               "1 s: stuck outside Python, or its host is overloaded)")


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
