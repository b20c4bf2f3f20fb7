"""A user transform applied to a loader's batches in ``k`` worker processes: order kept, memory bounded.

    workers = TransformWorkers(fn, workers=2, dataset="images", seed=seed)   # starts the processes
    for epoch in range(epochs):
        for batch in workers.map(loader_batches(epoch), epoch=epoch):       # in the order they came in
            ...
    workers.close()                                                          # or `with TransformWorkers(...)`

``fn(batch)`` takes a batch as the loader makes it (a dict of column -> tensor, numpy array or list of
bytes / str) and returns a dict of column -> tensor (decode JPEGs, tokenize, augment); ``collate``, when
given, turns what ``fn`` returns into that dict instead (``fn`` returns a list of per-example tensors,
``collate`` pads and stacks them). Both run in the worker, one after the other, so ``collate``'s cost is
spread over the workers too; what they return is yielded as it is (it must pickle). Both are pickled with
cloudpickle, so a lambda or a function defined inside the training function works; what they capture is
copied into each worker once. Batches travel to and from the workers over a Unix socket, tensors and numpy
arrays as raw buffers; give the stage CPU batches (before the loader moves them to the device). A worker's
prints go to the rank's stdout and stderr.

How workers start: the rank is never forked. A rank may have initialised CUDA, a gloo or NCCL process group
and their threads by the time it builds a loader, and a forked copy of such a process inherits locks held by
threads that do not exist in it, and a CUDA context it cannot use. So the rank starts one fresh interpreter
(``subprocess``, which execs at once: no Python code of the rank runs in a forked copy of it). That
interpreter, worker 0, imports torch, forks the other ``k - 1`` workers from itself (it has no CUDA, process
group or thread of the rank's), and transforms batches too; the workers share the pages of one torch import
instead of holding a copy each (:mod:`.transform_process`). ``forkserver`` is the same idea, but its server
is one per process that outlives every loader (and forks workers from a copy of the rank's ``__main__``,
imported once more); multiprocessing's own ``spawn`` re-imports the rank's ``__main__`` in every worker and
starts a resource-tracker process that outlives ``close()``. Here there are exactly ``k`` workers, gone when
``close()`` returns. Importing torch takes seconds, so workers start once per :class:`TransformWorkers` and
serve every epoch.

Randomness: before each batch, the worker seeds ``random``, ``numpy.random`` and torch's CPU generator from
``(seed, epoch, rank, batch index)`` (:func:`~.transform_process.seed_for`), and :func:`batch_seed` returns
that seed for a transform that makes its own generator. So an augmentation gives the same tensors whichever
worker runs it, with any ``workers`` (0 included), an epoch replays exactly, and two ranks draw differently.
The seed is the rank's, worked out per batch by :meth:`TransformWorkers.map`, so a seed restored from a
checkpoint takes effect at the next ``map``.

Hangs: a worker that is alive but stuck (a deadlock in a tokenizer, a network read that never returns) is
caught by ``timeout``, the seconds one batch may take in a worker (:data:`DEFAULT_TIMEOUT_S` unless given), as
torch's ``DataLoader(timeout=)``: past it the pool is closed and the iterator raises :class:`TransformError`.
"""
import itertools
import os
import socket
import subprocess
import time
import traceback
import weakref
from collections import deque
from multiprocessing.connection import wait as _wait_any
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

from . import transform_errors, worker_processes
from .transform_errors import TransformError, TransformPickleError, check_timeout
from .transform_process import apply, batch_seed, encode, recv, seed_for, send

__all__ = ["TransformWorkers", "TransformError", "TransformPickleError", "transformed", "batch_seed",
           "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 600.0  # far beyond any one batch's transform: only a worker that is stuck reaches it
# A worker not yet up (importing torch, unpickling the transform) has at least this long, however short the
# timeout: its start is not a batch's transform, yet a start that never ends must end the pool too.
START_TIMEOUT_S = 120.0


class _Failed:
    """A batch's answer that is an error, kept in its place until the batches before it are yielded."""

    def __init__(self, error: TransformError):
        self.error = error


class TransformWorkers:
    """``fn`` (then ``collate``) applied to batches in ``workers`` processes; see the module's docstring.

    ``workers=0`` runs them in the calling thread, no processes (the global generators are seeded the same
    way and put back afterwards). ``in_flight`` (default ``2 * workers``) bounds the batches taken from the
    input and not yet yielded: sent to a worker, being transformed, or transformed and waiting for an earlier
    one (an abandoned iterator's batches count until their answers are read and dropped); with the batch the
    consumer holds, the stage holds at most ``in_flight + 1`` batches' worth. Batches go to the worker with
    the fewest outstanding and come out in the order they went in. ``seed`` is :meth:`map`'s default seed.

    ``timeout``: the seconds a worker may spend on one batch (counted from when it starts on it, so batches
    queued behind it do not count; a worker's start, importing torch, does not count either); None for no
    limit. It does not apply to ``workers=0``, where the transform runs in the caller's thread.

    ``wait_seconds``: seconds the consumer spent inside this stage's iterators, not counting the time spent
    inside the input iterator (its own loader counts that): waiting for workers (or, with ``workers=0``,
    running the transform) and sending batches. ``batches``: batches yielded. Both summed over all epochs.

    One consumer thread at a time. Workers are stopped and joined by :meth:`close`, on leaving a ``with``
    block, when the object is garbage-collected, at interpreter exit; and they exit by themselves when the
    rank process dies.

    Raises:
        ValueError: ``workers`` < 0, ``in_flight`` < 1, or ``timeout`` neither None nor above 0.
        TransformPickleError: ``fn`` or ``collate`` cannot be pickled (with cloudpickle, so lambdas and
            functions defined inside the training function are fine).
        OSError: a worker process cannot be started.
    """

    def __init__(self, fn: Callable[[Any], Any], *, workers: int, dataset: str, seed: int = 0,
                 in_flight: Optional[int] = None, collate: Optional[Callable[[Any], Any]] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_S):
        if workers < 0:
            raise ValueError(f"dataset {dataset!r}: workers must be 0 (transform in the rank) or more, not {workers}")
        in_flight = 2 * workers if in_flight is None else in_flight
        if workers and in_flight < 1:
            raise ValueError(f"dataset {dataset!r}: in_flight must be at least 1, not {in_flight}")
        check_timeout(timeout, dataset)
        self.fn, self.collate, self.dataset, self.seed = fn, collate, dataset, seed
        self.workers, self.in_flight, self.timeout = workers, in_flight, timeout
        self.wait_seconds = 0.0
        self.batches = 0
        self._run = 0  # the current map() call; answers for an earlier, abandoned one are dropped
        self._closed = False
        self._broken: Optional[Exception] = None  # what closed the pool, raised again by later calls
        self._procs: List[subprocess.Popen] = []  # worker 0, which forks and reaps the others
        self._socks: List[socket.socket] = []
        self._pids: List[Optional[int]] = []  # each worker's, once its first message is read
        # Per worker, (run, index, epoch) of each batch sent and not yet answered, in the order sent: a
        # worker answers in that order.
        self._sent: List[Deque[Tuple[int, int, int]]] = []
        # Per worker, when it started on the first batch of its _sent (meaningful only while that is not empty);
        # until its pid arrives, when it was started.
        self._since: List[float] = []
        self._finalizer = weakref.finalize(self, worker_processes.stop, os.getpid(), self._procs, self._socks)
        if workers:
            payload = encode(self._pickled(fn, collate))
            try:
                proc, socks = worker_processes.start(workers)
                self._procs.append(proc)
                self._socks.extend(socks)
                self._sent.extend(deque() for _ in socks)
                self._pids.extend(None for _ in socks)
                self._since.extend(time.monotonic() for _ in socks)
                for sock in self._socks:
                    send(sock, payload)
            except BaseException:
                self.close()
                raise

    def _pickled(self, fn, collate) -> bytes:
        import cloudpickle

        try:
            return cloudpickle.dumps((fn, collate))
        except Exception as exc:
            raise TransformPickleError(
                f"dataset {self.dataset!r}: the transform {fn!r} (or its collate) cannot be pickled to send it "
                f"to the worker processes: {type(exc).__name__}: {exc}. Create what cannot be pickled (an open "
                "file, a lock, a client) inside the function on first use, or pass workers=0 to run the "
                "transform in the training process", self.dataset) from exc

    def _pid(self, w: int) -> Optional[int]:
        """Worker ``w``'s process id: the first message on its socket, read here if it has not been yet (it
        comes before any answer). None when the worker died before sending it."""
        if self._pids[w] is None:
            try:
                _, self._pids[w] = recv(self._socks[w])
            except (EOFError, OSError):
                return None
            self._since[w] = time.monotonic()  # up now: its start does not count toward a batch's timeout
        return self._pids[w]

    @property
    def pids(self) -> List[int]:
        """The worker processes' ids (empty with ``workers=0`` or once closed); waits for workers still
        starting."""
        if self._closed:
            return []
        return [pid for pid in map(self._pid, range(len(self._socks))) if pid is not None]

    def map(self, batches: Iterable[Any], *, epoch: int, start: int = 0, rank: int = 0, seed: Optional[int] = None,
            origins: Optional[Iterable[Tuple[int, int]]] = None) -> Iterator[Any]:
        """The transformed ``batches`` of ``epoch``, in their order; the first is batch ``start`` of the epoch
        (a loader resuming mid-epoch passes its position, so batch indexes and seeds stay those of the
        epoch). Starting another map abandons this one's iterator: it raises ``RuntimeError`` if resumed.

        Each batch's transform is seeded from ``(seed, epoch, rank, index)`` (``seed`` defaults to the pool's):
        ``rank`` and ``index`` are this rank's and the batch's place, or, where ``origins`` is given (one
        ``(rank, index)`` a batch, in order), the place in the epoch the batch was made for: a batch dealt
        out to another rank after a resize draws what it drew there.

        Raises (from the iterator):
            TransformError: the transform raised (message: dataset, epoch, batch index, the worker's
                traceback) or returned something that is not a dict without a ``collate``; a worker process
                died or spent more than ``timeout`` seconds on a batch (the pool is then closed, and later
                calls raise it again). Raised in batch order: the batches before the failed one come first.
            RuntimeError: the pool is closed, or a worker's answers are out of step with the batches sent
                (the pool is then closed).
        """
        if self._closed:
            raise self._broken or RuntimeError(f"dataset {self.dataset!r}: the transform workers are closed")
        self._run += 1
        seeds = _seeds(self.seed if seed is None else seed, epoch, rank, start, origins)
        if not self.workers:
            return self._inline(iter(batches), epoch, start, seeds, self._run)
        return self._parallel(iter(batches), epoch, start, seeds, self._run)

    def _error(self, epoch: int, index: int, summary: str, tb: str, where: str) -> TransformError:
        return TransformError(f"dataset {self.dataset!r}: the transform failed on batch {index} of epoch "
                              f"{epoch} ({where}): {summary}\n\n--- its traceback, {where} ---\n{tb}",
                              self.dataset, epoch, index, tb)

    def _check_current(self, run: int) -> None:
        if self._closed:
            raise self._broken or RuntimeError(f"dataset {self.dataset!r}: the transform workers are closed")
        if run != self._run:
            raise RuntimeError(f"dataset {self.dataset!r}: this iterator was abandoned: map() was called again")

    def _inline(self, it: Iterator, epoch: int, start: int, seeds: Iterator[int], run: int) -> Iterator[Any]:
        index = start
        for batch in it:
            t0 = time.perf_counter()
            try:
                out = apply(self.fn, self.collate, batch, next(seeds), keep_rng=True)
            except Exception as exc:
                raise self._error(epoch, index, traceback.format_exception_only(type(exc), exc)[-1].strip(),
                                  traceback.format_exc(), "in the training process") from exc
            del batch
            self.wait_seconds += time.perf_counter() - t0
            self.batches += 1
            yield out
            self._check_current(run)
            index += 1

    def _parallel(self, it: Iterator, epoch: int, start: int, seeds: Iterator[int], run: int) -> Iterator[Any]:
        done: Dict[int, Any] = {}  # answers (or _Failed) that came before an earlier batch's
        taken = given = start      # batches taken from `it`, yielded (as indexes of the epoch)
        exhausted = False
        t0, upstream = time.perf_counter(), 0.0
        while True:
            # Invariant: batches sent and not answered (an abandoned iterator's included) plus answers not
            # yielded stay within in_flight; so taken - given <= in_flight, and the stage's memory is bounded.
            while not exhausted and sum(map(len, self._sent)) + len(done) < self.in_flight:
                u0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    exhausted = True
                    break
                finally:
                    upstream += time.perf_counter() - u0
                self._submit(run, epoch, taken, next(seeds), batch)
                del batch
                taken += 1
            if given == taken:
                if exhausted:
                    return
                self._collect(run, done)  # every slot holds an abandoned iterator's batch: wait for one to free
                continue
            while given not in done:
                self._collect(run, done)
            out = done.pop(given)
            if isinstance(out, _Failed):  # raised in batch order: every batch before it was yielded
                raise out.error
            self.wait_seconds += time.perf_counter() - t0 - upstream
            self.batches += 1
            yield out
            del out
            self._check_current(run)
            given += 1
            t0, upstream = time.perf_counter(), 0.0

    def _submit(self, run: int, epoch: int, index: int, seed: int, batch: Any) -> None:
        try:
            parts = encode((run, index, seed, batch))
        except Exception as exc:
            raise TransformError(f"dataset {self.dataset!r}: batch {index} of epoch {epoch} cannot be pickled to "
                                 f"send it to a transform worker: {type(exc).__name__}: {exc}",
                                 self.dataset, epoch, index) from exc
        # The least busy worker: a slow batch delays only the batches queued behind it on that worker.
        w = min(range(self.workers), key=lambda i: len(self._sent[i]))
        try:
            send(self._socks[w], parts)
        except OSError:
            self._lost(w)
        if not self._sent[w]:
            self._since[w] = time.monotonic()  # an idle worker starts on it at once
        self._sent[w].append((run, index, epoch))

    def _collect(self, run: int, done: Dict[int, Any]) -> None:
        """Read the answers that are ready (waiting for one, up to the first deadline); keep this run's in
        ``done``, an error as :class:`_Failed`. Raises :class:`TransformError` once a worker is past the
        timeout."""
        busy = [w for w in range(self.workers) if self._sent[w]]
        ready = _wait_any([self._socks[w] for w in busy], self._time_left(busy))
        if not ready:
            self._check_deadlines(busy)
            return
        for sock in ready:
            w = self._socks.index(sock)
            if self._pids[w] is None:  # the worker's first message, its pid; answers follow
                if self._pid(w) is None:
                    self._lost(w)
                continue
            try:
                kind, answer_run, index, *rest = recv(sock)
            except (EOFError, OSError):
                self._lost(w)
            sent_run, sent_index, epoch = self._sent[w].popleft()
            self._since[w] = time.monotonic()  # it starts on the next batch it holds, if any
            if (sent_run, sent_index) != (answer_run, index):
                self._out_of_step(w, sent_index, index)
            if answer_run != run:
                continue  # for an iterator abandoned before it got this far
            if kind == "ok":
                done[index] = rest[0]
            else:
                summary, tb = rest
                done[index] = _Failed(self._error(epoch, index, summary, tb, f"in worker process {self._pids[w]}"))

    def _limit(self, w: int) -> float:
        """Seconds worker ``w`` may take: ``timeout`` on a batch; at least :data:`START_TIMEOUT_S` to come up."""
        return self.timeout if self._pids[w] is not None else max(self.timeout, START_TIMEOUT_S)

    def _time_left(self, busy: List[int]) -> Optional[float]:
        """Seconds until the first of the ``busy`` workers reaches its limit; None: no limit."""
        if self.timeout is None or not busy:
            return None
        return max(0.0, min(self._since[w] + self._limit(w) for w in busy) - time.monotonic())

    def _check_deadlines(self, busy: List[int]) -> None:
        """Close the pool and raise :class:`TransformError` if one of the ``busy`` workers is past its limit."""
        if self.timeout is None:
            return
        now = time.monotonic()
        late = [w for w in busy if now - self._since[w] >= self._limit(w)]
        if not late:
            return
        w = late[0]
        _, index, epoch = self._sent[w][0]
        if self._pids[w] is None:
            self._close_broken(transform_errors.not_started(self.dataset, w, self._limit(w), epoch, index))
        self._close_broken(transform_errors.too_slow(self.dataset, self._pids[w], self.timeout, epoch, index))

    def _out_of_step(self, w: int, due: int, answered: int) -> None:
        """Worker ``w`` answered another batch than the one due: close the pool and raise ``RuntimeError``."""
        self._close_broken(transform_errors.out_of_step(self.dataset, self._pids[w], due, answered))

    def _lost(self, w: int) -> None:
        """Worker ``w`` closed its socket: it died. Close the pool and raise :class:`TransformError`."""
        pid, how = worker_processes.how_it_ended(self._procs[0], w, self._pid(w))
        _, index, epoch = self._sent[w][0] if self._sent[w] else (None, None, None)
        self._close_broken(transform_errors.died(self.dataset, pid, how, epoch, index))

    def _close_broken(self, error: Exception) -> None:
        """Close the pool, then raise ``error``, which later calls raise again."""
        self._broken = error
        self.close()
        raise error

    def close(self) -> None:
        """Stop and join the worker processes; idempotent. Iterators of this pool fail afterwards."""
        self._closed = True
        self._finalizer()
        for sent in self._sent:
            sent.clear()

    def __enter__(self) -> "TransformWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _seeds(seed: int, epoch: int, rank: int, start: int, origins: Optional[Iterable[Tuple[int, int]]]
           ) -> Iterator[int]:
    """The seed of each batch of a :meth:`TransformWorkers.map`, in order (see there)."""
    places = ((rank, index) for index in itertools.count(start)) if origins is None else origins
    for origin_rank, index in places:
        yield seed_for(seed, epoch, origin_rank, index)


def transformed(batches: Iterable[Any], fn: Callable[[Any], Any], *, workers: int, dataset: str, epoch: int,
                seed: int = 0, in_flight: Optional[int] = None, collate: Optional[Callable[[Any], Any]] = None,
                start: int = 0, rank: int = 0, timeout: Optional[float] = DEFAULT_TIMEOUT_S) -> Iterator[Any]:
    """One epoch through a :class:`TransformWorkers` of its own, closed when the iterator ends or is closed.
    Workers start on the first ``next()``; a loader that runs several epochs should keep one
    :class:`TransformWorkers` instead. Raises what :class:`TransformWorkers` and its ``map`` raise."""
    with TransformWorkers(fn, workers=workers, dataset=dataset, seed=seed, in_flight=in_flight,
                          collate=collate, timeout=timeout) as pool:
        yield from pool.map(batches, epoch=epoch, start=start, rank=rank)
