"""An append-only log in the run's sealed store: how ranks and supervisors tell the driver things.

Reports, printed lines and failures each travel in one :class:`StoreLog`: a FIFO queue of sealed records in
the store (``TCPStore.queue_push`` / ``queue_pop``). Any number of writers append; one reader (the
coordinator) takes the records in the order the store received them, and a record is gone from the store
once taken. Three invariants follow:

- **Bounded.** What the store holds for a log is what its reader has not taken yet; a writer that respects
  ``max_unread`` (:meth:`StoreLog.has_room`) keeps that to a fixed number of records.
- **Nothing to trust but the seal.** There is no counter a stranger could raise to make the reader loop or
  allocate: a forged record is popped and dropped (it costs what any forged value costs), a replayed one
  (a record seen before, pushed again) is dropped by its writer's sequence number.
- **Taken once.** The reader's :meth:`StoreLog.take` pops; nothing is read twice or kept in the store.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional

from .sealed_store import EMPTY, FORGED, SealedStore

TAKE_LIMIT = 1024  # records one take() pops at most, so one call's work is bounded whatever was pushed


class StoreLog:
    """One log, by ``name``, in ``store``; ``writer`` names this side's records when it appends (unique per
    writing process: a rank, a supervisor)."""

    def __init__(self, store: SealedStore, name: str, writer: str = ""):
        self.store, self.name, self.writer = store, name, writer
        self._seq = itertools.count(1)
        self._lock = threading.Lock()  # one process's threads (a loader's, the training loop) share a writer
        self._last_seen: Dict[str, int] = {}  # the reader's: writer -> the highest sequence number taken
        self.dropped = 0  # the reader's: forged or replayed records popped and dropped

    # -- the writers' side --------------------------------------------------------------------------------
    def append(self, value: Any, confirm: bool = True) -> Optional[int]:
        """Append ``value``; returns the records now waiting to be taken (this one included). Returns only
        once the store holds it: the length is a round trip after the push on the same connection.
        ``confirm=False``: the push alone, returning ``None``; the store applies a connection's requests in
        order, so the next round trip on it (:meth:`confirm`) returns once this record is in."""
        with self._lock:
            self.store.push(self.name, (self.writer, next(self._seq), value))
            return self.store.queue_len(self.name) if confirm else None

    def confirm(self) -> int:
        """A round trip: once it returns, every record this writer appended is in the store; returns the records
        waiting to be taken."""
        with self._lock:
            return self.store.queue_len(self.name)

    def has_room(self, max_unread: int) -> bool:
        """Whether fewer than ``max_unread`` records wait to be taken (a writer that would exceed it waits)."""
        return self.store.queue_len(self.name) < max_unread

    # -- the reader's side --------------------------------------------------------------------------------
    def take(self, limit: int = TAKE_LIMIT) -> List[Any]:
        """Pop up to ``limit`` records, oldest first; returns their values. Forged and replayed records are
        dropped (counted in :attr:`dropped`)."""
        values = []
        # Asked first, then popped exactly: an empty queue's pop raises inside torch, a dearer answer than a length.
        for _ in range(min(self.store.queue_len(self.name), limit)):
            record = self.store.pop(self.name)
            if record is EMPTY:
                break
            if record is FORGED or not _well_formed(record):
                self.dropped += 1
                continue
            writer, seq, value = record
            if seq <= self._last_seen.get(writer, 0):
                self.dropped += 1
                continue
            self._last_seen[writer] = seq
            values.append(value)
        return values


def _well_formed(record) -> bool:
    return (isinstance(record, tuple) and len(record) == 3 and isinstance(record[0], str)
            and isinstance(record[1], int))
