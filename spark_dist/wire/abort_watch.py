"""The run's abort, as a supervisor learns it: a woken wait on the ``abort`` key, not a poll.

An :class:`AbortWatch` holds a store connection of its own in a thread blocked in the store's wait on ``abort``:
the server keeps one waiter per watch and wakes it when the key is set, so a run of n ranks costs the driver's
store no requests between aborts, and every supervisor learns of an abort about at once.

Only a sealed value counts, as for :meth:`~spark_dist.wire.sealed_store.SealedStore.lookup`: a forged value
wakes the watch but stops nothing, and while it sits in the key the watch looks every ``poll`` seconds (what a
poll cost before) until a sealed value replaces it. A watch whose connection failed says so (:attr:`live`
false), and its owner looks for itself.

A watch outlives its supervisor until the key is set: whoever hosts the store calls :func:`release` before
dropping it, once every rank has ended, so no watch waits on a closed connection (torch logs each such wait).
Release also waits for that store's watches in its own process (local mode's supervisors) to end: a watch thread
still inside a store call as the interpreter finalizes is ended in the middle of torch's C++ code, which aborts
the process ("terminate called without an active exception").
"""
from __future__ import annotations

import threading
import time
import weakref
from datetime import timedelta
from typing import Callable, Optional

from .protocol import ABORT, Abort
from .sealed_store import SealedStore

# One wait's bound: a watch that times out waits again (torch logs two warnings a timeout: rare at this bound).
WAIT_S = 24 * 3600.0
# How long release waits for this process's watches of the store to end (woken, each ends within a round trip).
RELEASE_JOIN_S = 5.0

_watches: "weakref.WeakSet[AbortWatch]" = weakref.WeakSet()  # every watch this process started
_watches_lock = threading.Lock()


class AbortWatch:
    """Watches ``abort`` through the store ``connect()`` returns (a connection of its own: the wait blocks it).
    :attr:`value` is the sealed abort once seen; :meth:`close` tells it its owner no longer cares."""

    def __init__(self, connect: Callable[[], SealedStore], poll: float, wait_s: float = WAIT_S):
        self.value: Optional[Abort] = None
        self.live = True  # False once the watch ended without a value: its owner looks at the key itself
        self._connect, self._poll, self._wait_s = connect, poll, wait_s
        self._closed = threading.Event()
        self._key: Optional[str] = None  # the store key it waits on, once connected
        with _watches_lock:
            _watches.add(self)
        self._thread = threading.Thread(target=self._run, daemon=True, name="spark_dist-abort-watch")
        self._thread.start()

    def close(self) -> None:
        """The owner is done: the watch makes no more requests once its wait returns."""
        self._closed.set()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            store = self._connect()
            self._key = store.key(ABORT)
            key = [self._key]
            while not self._closed.is_set():
                if not store.raw.check(key):
                    try:
                        store.raw.wait(key, timedelta(seconds=self._wait_s))
                    except Exception:  # noqa: BLE001 -- a timeout (wait again), or closed (the check raises)
                        store.raw.check(key)
                    continue
                if self._closed.is_set():
                    break
                value = store.lookup(ABORT)
                if value is not None:
                    self.value = value
                    return
                self._closed.wait(self._poll)  # a forged value sits in the key: looked at until ours replaces it
        except Exception:  # noqa: BLE001 -- the store is gone or unreachable: the owner looks for itself
            pass
        self.live = False


def release(store: SealedStore, join_s: float = RELEASE_JOIN_S) -> None:
    """Wake every watch still waiting before the store is dropped: sets ``abort`` to :attr:`Abort.ENDED` unless a
    sealed abort is there already. A supervisor still running then stops its rank, as it would on losing the store:
    called as the store is dropped, once every rank has ended or the run is over regardless. Then waits (up to
    ``join_s``) for this process's watches of that store, and those still connecting, to end."""
    try:
        if store.lookup(ABORT) is None:
            store.put(ABORT, Abort.ENDED)
    except Exception:  # noqa: BLE001 -- best effort: the store is going away
        pass
    key = store.key(ABORT)
    with _watches_lock:
        ours = [w for w in _watches if w._key in (key, None)]
    deadline = time.monotonic() + join_s
    for watch in ours:
        watch.join(max(deadline - time.monotonic(), 0.0))
