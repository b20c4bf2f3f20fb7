"""What the ranks print, on the driver: each rank's stdout and stderr lines, prefixed with its rank.

In the task, :class:`StreamReader` threads read the rank's two pipes: every byte still goes to the task's own
stdout / stderr (the executor log, as before), and every line into the rank's :class:`LineBuffer`. The
supervisor publishes the buffer to the run's signed store every :data:`PUBLISH_S` (and once more after the
rank exited, so the last lines before a SIGKILL arrive too): ``out/<rank>/<n>`` holds a list of
``(stream, line)`` and the counter ``out_seq/<rank>`` is bumped only after the value is written, so the driver
never waits for a slot. On the driver :func:`OutputRelay.drain` prints each new line to ``sys.stdout`` or
``sys.stderr`` as they are at that moment (a notebook cell, ``redirect_stdout`` and spark-submit's console
all see them).

A carriage-return progress bar (tqdm, Lightning) is a line ending in ``\\r``: only its latest state is kept,
and it is passed on at most every :data:`PROGRESS_EVERY_S` per stream. If the store cannot be reached the
lines stay in the executor log, and one warning there says so; training goes on.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

PUBLISH_S = 0.1
PROGRESS_EVERY_S = 0.5
MAX_CHUNK_BYTES = 1 << 20  # one store value at most (a longer line travels whole, alone)
LOG_RANKS = ("all", "rank0", "none")


def out_key(rank: int, seq: int) -> str:
    return f"out/{rank}/{seq}"


def out_seq_key(rank: int) -> str:
    return f"out_seq/{rank}"


class LineBuffer:
    """The lines a rank printed and not yet published, in the order its two streams delivered them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lines: List[Tuple[str, str]] = []
        self._progress: Dict[str, Tuple[str, float, bool]] = {}  # stream -> (latest, last emitted, pending)

    def add(self, stream: str, line: str) -> None:
        with self._lock:
            self._progress.pop(stream, None)  # a full line ends the bar's updates
            self._lines.append((stream, line))

    def progress(self, stream: str, state: str) -> None:
        """A carriage-return update: kept as the latest state, passed on at most every PROGRESS_EVERY_S."""
        now = time.monotonic()
        with self._lock:
            _, emitted, _ = self._progress.get(stream, ("", 0.0, False))
            if now - emitted >= PROGRESS_EVERY_S:
                self._lines.append((stream, state))
                self._progress[stream] = (state, now, False)
            else:
                self._progress[stream] = (state, emitted, True)

    def take(self, final: bool = False) -> List[Tuple[str, str]]:
        """The lines to publish now (with a bar's pending latest state once it is due, or at the end)."""
        now = time.monotonic()
        with self._lock:
            for stream, (state, emitted, pending) in list(self._progress.items()):
                if pending and (final or now - emitted >= PROGRESS_EVERY_S):
                    self._lines.append((stream, state))
                    self._progress[stream] = (state, now, False)
            lines, self._lines = self._lines, []
        return lines


class StreamReader(threading.Thread):
    """Reads one of the rank's pipes to its end: passes the bytes on to ``forward`` (the task's own stream)
    and the decoded lines into ``lines``; keeps the last ``tail_bytes`` for failure reports."""

    def __init__(self, fd: int, stream: str, lines: LineBuffer, forward, tail_bytes: int = 0):
        super().__init__(daemon=True, name=f"spark_dist-{stream}")
        self.fd, self.stream, self.lines, self.forward = fd, stream, lines, forward
        self.tail_bytes = tail_bytes
        self.tail = bytearray()
        self.total = 0  # bytes read so far (the tail itself is trimmed)
        self._partial = b""

    def run(self):
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.total += len(data)
            if self.tail_bytes:
                self.tail += data
                del self.tail[:-self.tail_bytes]
            try:
                if self.forward is not None:
                    self.forward.write(data)
                    self.forward.flush()
            except Exception:  # noqa: BLE001 -- the executor log is best effort
                pass
            self._split(data)
        if self._partial:  # a last line without its newline
            self.lines.add(self.stream, self._decode(self._partial))
        os.close(self.fd)

    def _split(self, data: bytes) -> None:
        *complete, partial = (self._partial + data).split(b"\n")
        for line in complete:
            # A line with redraws in it (a bar that ended with its newline): what a terminal shows is the
            # text after the last carriage return.
            shown = [part for part in line.split(b"\r") if part.strip()]
            self.lines.add(self.stream, self._decode(shown[-1] if shown else b""))
        if b"\r" in partial:  # a bar redrawing itself: each state ends at its carriage return
            *states, partial = partial.split(b"\r")
            drawn = [state for state in states if state.strip()]
            if drawn:
                self.lines.progress(self.stream, self._decode(drawn[-1]))
        self._partial = partial

    @staticmethod
    def _decode(data: bytes) -> str:
        return data.decode("utf-8", "replace")

    def text(self) -> str:
        return self.tail.decode("utf-8", "replace")

    def since(self, total: int) -> str:
        """What arrived after ``total`` bytes had been read (as much as the tail still holds)."""
        new = self.total - total
        return bytes(self.tail[-new:]).decode("utf-8", "replace") if new > 0 else ""


class Publisher:
    """Publishes a rank's lines to the store; the channel breaking stops it (one warning), not the rank."""

    def __init__(self, store, rank: int, lines: LineBuffer):
        self.store, self.rank, self.lines = store, rank, lines
        self.seq = 0
        self.broken = False
        self.next_at = 0.0

    def publish(self, final: bool = False) -> None:
        if not final and time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + PUBLISH_S
        lines = self.lines.take(final)
        if not lines or self.broken:
            return
        try:
            for chunk in _chunks(lines):
                self.store.put(out_key(self.rank, self.seq + 1), chunk)
                self.seq += 1
                self.store.counter(out_seq_key(self.rank))  # only once the value is there
        except Exception as exc:  # noqa: BLE001 -- the driver's store is gone: the executor log still has it
            self.broken = True
            sys.stderr.write(f"spark_dist: WARNING: rank {self.rank}'s output no longer reaches the driver "
                             f"({exc!r}); it stays in this executor log\n")


def _chunks(lines: List[Tuple[str, str]]):
    chunk, size = [], 0
    for stream, line in lines:
        if chunk and size + len(line) > MAX_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append((stream, line))
        size += len(line) + 8
    if chunk:
        yield chunk


class OutputRelay:
    """The driver's side: fetches each rank's new lines from the store and passes them to ``show``."""

    def __init__(self, store, show: Callable[[int, str, str], None]):
        self.store, self.show = store, show
        self.seen: Dict[int, int] = {}

    def drain(self, ranks) -> None:
        for rank in ranks:
            latest = self.store.counter(out_seq_key(rank), 0)
            for seq in range(self.seen.get(rank, 0) + 1, latest + 1):
                if self.store.has(out_key(rank, seq)):  # a forged or missing value is skipped
                    for stream, line in self.store.get(out_key(rank, seq)):
                        self.show(rank, stream, line)
            self.seen[rank] = max(latest, self.seen.get(rank, 0))


def printer(log_ranks: str) -> Optional[Callable[[int, str, str], None]]:
    """What :class:`OutputRelay` calls on the driver for ``log_ranks`` (``None`` for ``"none"``)."""
    if log_ranks == "none":
        return None

    def show(rank: int, stream: str, line: str) -> None:
        if log_ranks == "rank0" and rank != 0:
            return
        target = sys.stderr if stream == "stderr" else sys.stdout  # looked up now: redirect_stdout works
        print(f"[rank {rank}] {line}", file=target, flush=True)
    return show


class ProgressBar:
    """The driver's bar over rank 0's loader (``tqdm.auto``: a widget in a notebook, text elsewhere): one
    epoch at a time, its steps as the loader counts them, the latest metrics rank 0 reported as its postfix.
    Nothing is drawn until progress arrives, nor without tqdm."""

    def __init__(self):
        self._bar = None
        self._epoch = None

    def advance(self, epoch: int, step: int, steps: int) -> None:
        if self._bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=steps, unit="step", dynamic_ncols=True)
        if epoch != self._epoch:
            self._epoch = epoch
            self._bar.reset(total=steps)
            self._bar.set_description(f"epoch {epoch}")
        self._bar.update(step - self._bar.n)
        if step >= steps:  # an epoch's end is drawn at once (tqdm skips redraws within its mininterval)
            self._bar.refresh()

    def show_metrics(self, metrics: dict) -> None:
        if self._bar is not None:
            self._bar.set_postfix({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._epoch = None, None
