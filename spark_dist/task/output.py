"""What the ranks print, on the driver: each rank's stdout and stderr lines, prefixed with its rank.

In the task, :class:`StreamReader` threads read the rank's two pipes: every byte still goes to the task's own
stdout / stderr (the executor log), the last bytes of stderr stay for a failure report, and, only when the
driver shows this rank's lines (``log_ranks``), every line goes into the rank's :class:`LineBuffer`. The
supervisor's :class:`Publisher` appends the buffer to the run's ``output`` log (:mod:`spark_dist.wire.store_log`)
every :data:`PUBLISH_S` and once more after the rank exited, so the last lines before a SIGKILL arrive too.
On the driver :class:`OutputRelay` takes them (deleting them from the store) and prints each line to
``sys.stdout`` or ``sys.stderr`` as they are at that moment (a notebook cell, ``redirect_stdout`` and
spark-submit's console all see them).

Memory stays bounded however much a rank prints: the buffer holds at most :data:`BUFFER_BYTES` (the reader
then stops reading the pipe, so the rank waits on its writes, as it would on a slow terminal), and the store
at most :data:`MAX_UNREAD` chunks of at most :data:`MAX_CHUNK_BYTES` that the driver has not taken yet, and
what each rank pushed since it last asked (:data:`CONFIRM_EVERY` chunks or :data:`CONFIRM_BYTES`).
A carriage-return progress bar (tqdm, Lightning) is a line ending in ``\\r``: only its latest state is kept,
and it is passed on at most every :data:`PROGRESS_EVERY_S` per stream. If the store cannot be reached the
lines stay in the executor log, and one warning there says so; training goes on.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

from ..wire.protocol import OUTPUT
from ..wire.store_log import StoreLog

PUBLISH_S = 0.1
PROGRESS_EVERY_S = 0.5
MAX_CHUNK_BYTES = 256 << 10  # one store record at most (a longer line travels whole, alone)
MAX_UNREAD = 32  # output records the store holds untaken, all ranks together
CONFIRM_EVERY, CONFIRM_BYTES = 8, 64 << 10  # a publisher's pushes (or bytes) between two round trips, at most
BUFFER_BYTES = 4 << 20  # a rank's lines read from its pipes and not yet published
FLUSH_S = 30.0  # after the rank exited, how long its supervisor keeps publishing what is left
LOG_RANKS = ("all", "rank0", "none")


def relays(log_ranks: str, rank: int) -> bool:
    """Whether the driver shows ``rank``'s lines (so its supervisor publishes them) for ``log_ranks``."""
    return log_ranks == "all" or (log_ranks == "rank0" and rank == 0)


class LineBuffer:
    """The lines a rank printed and not yet published, in the order its two streams delivered them. Holds at
    most ``max_bytes``: :meth:`add` waits for :meth:`take` beyond that (until :meth:`close`)."""

    def __init__(self, max_bytes: int = BUFFER_BYTES):
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)
        self._lines: List[Tuple[str, str]] = []
        self._bytes = 0
        self._max_bytes = max_bytes
        self._closed = False
        self._progress: Dict[str, Tuple[str, float, bool]] = {}  # stream -> (latest, last emitted, pending)

    def add(self, stream: str, line: str) -> None:
        with self._lock:
            while self._bytes >= self._max_bytes and not self._closed:
                self._taken.wait()
            if self._closed:
                return
            self._progress.pop(stream, None)  # a full line ends the bar's updates
            self._lines.append((stream, line))
            self._bytes += len(line)

    def close(self) -> None:
        """Stop buffering (the channel broke, or the supervisor gave up flushing): ``add`` drops from now."""
        with self._lock:
            self._closed = True
            self._lines, self._bytes = [], 0
            self._taken.notify_all()

    def progress(self, stream: str, state: str) -> None:
        """A carriage-return update: kept as the latest state, passed on at most every PROGRESS_EVERY_S."""
        now = time.monotonic()
        with self._lock:
            _, emitted, _ = self._progress.get(stream, ("", 0.0, False))
            if now - emitted >= PROGRESS_EVERY_S:
                self._lines.append((stream, state))
                self._bytes += len(state)  # take() subtracts every line it takes: count each one added
                self._progress[stream] = (state, now, False)
            else:
                self._progress[stream] = (state, emitted, True)

    def take(self, final: bool = False, max_bytes: int = MAX_CHUNK_BYTES) -> List[Tuple[str, str]]:
        """The next lines to publish, about ``max_bytes`` of them (a longer line alone), with a bar's pending
        latest state once it is due (or at the end)."""
        now = time.monotonic()
        with self._lock:
            for stream, (state, emitted, pending) in list(self._progress.items()):
                if pending and (final or now - emitted >= PROGRESS_EVERY_S):
                    self._lines.append((stream, state))
                    self._bytes += len(state)
                    self._progress[stream] = (state, now, False)
            count, size, chars = 0, 0, 0  # size counts a record's overhead per line; chars what the buffer holds
            for _, line in self._lines:
                if count and size + len(line) > max_bytes:
                    break
                count, size, chars = count + 1, size + len(line) + 8, chars + len(line)
            lines, self._lines = self._lines[:count], self._lines[count:]
            self._bytes -= chars
            self._taken.notify_all()
        return lines

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._lines) or any(pending for *_, pending in self._progress.values())


class StreamReader(threading.Thread):
    """Reads one of the rank's pipes to its end: passes the bytes on to ``forward`` (the task's own stream)
    and the decoded lines into ``lines`` (``None``: nobody reads them); keeps the last ``tail_bytes`` for
    failure reports."""

    def __init__(self, fd: int, stream: str, lines: Optional[LineBuffer], forward, tail_bytes: int = 0):
        super().__init__(daemon=True, name=f"spark_dist-{stream}")
        self.fd, self.stream, self.lines, self.forward = fd, stream, lines, forward
        self.tail_bytes = tail_bytes
        self.tail = bytearray()
        self._partial = b""

    def run(self):
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            if self.tail_bytes:
                self.tail += data
                del self.tail[:-self.tail_bytes]
            try:
                if self.forward is not None:
                    self.forward.write(data)
                    self.forward.flush()
            except Exception:  # noqa: BLE001 -- the executor log is best effort
                pass
            if self.lines is not None:
                self._split(data)
        if self._partial and self.lines is not None:  # a last line without its newline
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


class Publisher:
    """Appends a rank's lines to the run's ``output`` log, a chunk at a time while the store has room for
    them; the channel breaking stops it (one warning), not the rank."""

    def __init__(self, store, rank: int, lines: LineBuffer):
        self.log = StoreLog(store, OUTPUT, writer=f"rank{rank}")
        self.rank, self.lines = rank, lines
        self.broken = False
        self.next_at = 0.0
        self._room = MAX_UNREAD  # what the last round trip said the store had left, less the pushes since
        self._unconfirmed = (0, 0)  # chunks and bytes pushed since the last round trip

    def publish(self, final: bool = False) -> None:
        """Publish what is due, as far as the store has room now (never waits for the driver)."""
        if self.broken or (not final and time.monotonic() < self.next_at):
            return
        self.next_at = time.monotonic() + PUBLISH_S
        try:
            while self.lines:
                if self._room <= 0 and not self.log.has_room(MAX_UNREAD):
                    self.next_at = 0.0  # the driver has not taken the earlier chunks yet: look again soon
                    return
                lines = self.lines.take(final)
                if not lines:
                    return
                self._append(lines)
        except Exception as exc:  # noqa: BLE001 -- the driver's store is gone: the executor log still has it
            self.broken = True
            self.lines.close()
            sys.stderr.write(f"spark_dist: WARNING: rank {self.rank}'s output no longer reaches the driver "
                             f"({exc!r}); it stays in this executor log\n")

    def _append(self, lines: List[Tuple[str, str]]) -> None:
        """Push a chunk; a round trip (which also says the room left) only every CONFIRM_EVERY chunks or
        CONFIRM_BYTES: a publish then costs the driver's store one request, not two, and a rank has at most
        that much in flight beyond what the last round trip allowed. Its supervisor's later requests on the same
        connection (the ``ended`` key last) reach the store after these pushes."""
        chunks, size = self._unconfirmed
        chunks, size = chunks + 1, size + sum(len(line) for _, line in lines)
        confirm = chunks >= CONFIRM_EVERY or size >= CONFIRM_BYTES or self._room <= 1
        waiting = self.log.append((self.rank, lines), confirm=confirm)
        if confirm:
            self._room, self._unconfirmed = MAX_UNREAD - waiting, (0, 0)
        else:
            self._room, self._unconfirmed = self._room - 1, (chunks, size)

    def flush(self, readers, timeout: float = FLUSH_S, pipes_grace: float = 2.0) -> None:
        """After the rank exited: publish until its pipes are read to their end (``pipes_grace`` seconds at
        most: a process the rank left behind may hold them open) and the buffer is empty, while the driver
        keeps taking; ``timeout`` seconds in all at most. Whatever is left then stays in the executor log."""
        started = time.monotonic()
        while not self.broken:
            self.publish(final=True)
            now = time.monotonic()
            pipes_done = not any(r.is_alive() for r in readers) or now - started > pipes_grace
            if (pipes_done and not self.lines) or now - started > timeout:
                break
            time.sleep(0.01)
        self.lines.close()


class OutputRelay:
    """The driver's side: takes the ranks' new lines from the store and passes them to ``show``."""

    def __init__(self, store, show: Callable[[int, str, str], None]):
        self.log = StoreLog(store, OUTPUT)
        self.show = show

    def drain(self) -> int:
        """Show what arrived (at most what the store may hold, so the driver never holds more either);
        returns the number of records taken."""
        chunks = self.log.take(limit=MAX_UNREAD)
        for rank, lines in chunks:
            for stream, line in lines:
                self.show(rank, stream, line)
        return len(chunks)


class OutputTail:
    """The last lines each rank printed, at most ``max_bytes`` a rank, with a count of those dropped: what
    the first task keeps under Spark Connect, where the lines reach the client only at the end."""

    def __init__(self, max_bytes: int = 256 << 10):
        self.max_bytes = max_bytes
        self.lines: Dict[int, Deque[Tuple[str, str]]] = {}
        self.size: Dict[int, int] = {}
        self.dropped: Dict[int, int] = {}

    def __call__(self, rank: int, stream: str, line: str) -> None:
        kept = self.lines.setdefault(rank, deque())
        kept.append((stream, line))
        self.size[rank] = self.size.get(rank, 0) + len(line)
        while self.size[rank] > self.max_bytes and len(kept) > 1:
            _, old = kept.popleft()
            self.size[rank] -= len(old)
            self.dropped[rank] = self.dropped.get(rank, 0) + 1

    def items(self) -> Tuple[Tuple[int, str, str], ...]:
        """``(rank, stream, line)`` for each kept line, a rank's dropped ones announced first."""
        out = []
        for rank in sorted(self.lines):
            if self.dropped.get(rank):
                out.append((rank, "stderr", f"[spark_dist] {self.dropped[rank]} earlier lines of rank {rank} "
                                            "are in its executor's log only"))
            out.extend((rank, stream, line) for stream, line in self.lines[rank])
        return tuple(out)


def printer(log_ranks: str) -> Optional[Callable[[int, str, str], None]]:
    """What :class:`OutputRelay` calls on the driver for ``log_ranks`` (``None`` for ``"none"``)."""
    if log_ranks == "none":
        return None

    def show(rank: int, stream: str, line: str) -> None:
        if not relays(log_ranks, rank):
            return
        target = sys.stderr if stream == "stderr" else sys.stdout  # looked up now: redirect_stdout works
        print(f"[rank {rank}] {line}", file=target, flush=True)
    return show


class ProgressBar:
    """The driver's bar over rank 0's loader (``tqdm.auto``: a widget in a notebook, text elsewhere): one
    epoch at a time, its steps as the loader counts them, the rate rank 0 measured itself (the driver sees
    progress only every so often, so a rate timed here would be the update's, not the training's), and the
    latest metrics rank 0 reported. Nothing is drawn until progress arrives, nor without tqdm."""

    BAR_FORMAT = "{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self):
        self._bar = None
        self._epoch = None
        self._rate: Optional[float] = None
        self._metrics: Dict[str, float] = {}

    def advance(self, epoch: int, step: int, steps: int, rate: Optional[float] = None,
                finished: Optional[tuple] = None) -> None:
        """Show ``step`` of ``steps`` in ``epoch``; ``rate``: steps per second as rank 0 measured them;
        ``finished``: ``(epoch, steps, rate)`` of the last epoch rank 0 finished, drawn complete first if this
        bar never showed its end (an epoch shorter than the driver's read interval)."""
        if finished is not None and finished[0] != epoch and (self._epoch is None or finished[0] > self._epoch):
            self.advance(finished[0], finished[1], finished[1], finished[2])
        if self._bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=steps, unit="step", dynamic_ncols=True, bar_format=self.BAR_FORMAT)
        if epoch != self._epoch:
            if self._epoch is not None and self._bar.n < self._bar.total:  # rank 0 finished it meanwhile
                self._bar.update(self._bar.total - self._bar.n)
                self._bar.refresh()
            self._epoch = epoch
            self._bar.reset(total=steps)
            self._bar.set_description(f"epoch {epoch}")
        self._rate = rate
        self._bar.set_postfix_str(self.postfix(), refresh=False)
        self._bar.update(step - self._bar.n)
        if step >= steps:  # an epoch's end is drawn at once (tqdm skips redraws within its mininterval)
            self._bar.refresh()

    def show_metrics(self, metrics: dict) -> None:
        self._metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(), refresh=True)

    def postfix(self) -> str:
        """``<rate> step/s, name=value, ...``: the rank's rate, then the metrics."""
        parts = [] if self._rate is None else [f"{self._rate:.3g} step/s"]
        parts += [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self._metrics.items()]
        return ", ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._epoch, self._rate, self._metrics = None, None, None, {}
