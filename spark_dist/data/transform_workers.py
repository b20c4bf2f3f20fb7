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
``(seed, epoch, batch index)`` (:func:`~.transform_process.seed_for`), and :func:`batch_seed` returns that
seed for a transform that makes its own generator. So an augmentation gives the same tensors whichever
worker runs it, with any ``workers`` (0 included), and an epoch replays exactly.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from multiprocessing.connection import wait as _wait_any
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

from ..errors import DatasetError
from .transform_process import BOOT, apply, batch_seed, encode, forked_exit_code, recv, send

__all__ = ["TransformWorkers", "TransformError", "TransformPickleError", "transformed", "batch_seed"]

_STOP_GRACE_S = 5.0  # close(): how long workers get to exit on end of file before they are killed


class TransformError(DatasetError):
    """A transform failed on a batch (or its worker process died). The message names the dataset, the epoch
    and the batch's index in it, and holds the worker's traceback; so do ``dataset``, ``epoch``, ``batch``
    and ``worker_traceback``."""

    def __init__(self, message: str, dataset: Optional[str] = None, epoch: Optional[int] = None,
                 batch: Optional[int] = None, worker_traceback: str = ""):
        super().__init__(message, dataset)
        self.epoch, self.batch, self.worker_traceback = epoch, batch, worker_traceback

    def __reduce__(self):  # keep the fields when a rank's error travels to the driver
        return type(self), (str(self), self.dataset, self.epoch, self.batch, self.worker_traceback)


class TransformPickleError(DatasetError, TypeError):
    """The transform (or ``collate``) cannot be pickled to send it to the worker processes. Both a
    :class:`DatasetError` naming the dataset and a ``TypeError``, which is what pickling raises."""


def _stop(owner: int, procs: List[subprocess.Popen], socks: List[socket.socket]) -> None:
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
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    procs.clear()
    socks.clear()


class TransformWorkers:
    """``fn`` (then ``collate``) applied to batches in ``workers`` processes; see the module's docstring.

    ``workers=0`` runs them in the calling thread, no processes (the global generators are seeded the same
    way and put back afterwards). ``in_flight`` (default ``2 * workers``) bounds the batches taken from the
    input and not yet yielded: sent to a worker, being transformed, or transformed and waiting for an earlier
    one (an abandoned iterator's batches count until their answers are read and dropped); with the batch the
    consumer holds, the stage holds at most ``in_flight + 1`` batches' worth. Batches go to the worker with
    the fewest outstanding and come out in the order they went in.
    ``seed`` with the epoch and batch index seeds each batch's transform.

    ``wait_seconds``: seconds the consumer spent inside this stage's iterators, not counting the time spent
    inside the input iterator (its own loader counts that): waiting for workers (or, with ``workers=0``,
    running the transform) and sending batches. ``batches``: batches yielded. Both summed over all epochs.

    One consumer thread at a time. Workers are stopped and joined by :meth:`close`, on leaving a ``with``
    block, when the object is garbage-collected, at interpreter exit; and they exit by themselves when the
    rank process dies.

    Raises:
        ValueError: ``workers`` < 0 or ``in_flight`` < 1.
        TransformPickleError: ``fn`` or ``collate`` cannot be pickled (with cloudpickle, so lambdas and
            functions defined inside the training function are fine).
        OSError: a worker process cannot be started.
    """

    def __init__(self, fn: Callable[[Any], Any], *, workers: int, dataset: str, seed: int = 0,
                 in_flight: Optional[int] = None, collate: Optional[Callable[[Any], Any]] = None):
        if workers < 0:
            raise ValueError(f"dataset {dataset!r}: workers must be 0 (transform in the rank) or more, not {workers}")
        in_flight = 2 * workers if in_flight is None else in_flight
        if workers and in_flight < 1:
            raise ValueError(f"dataset {dataset!r}: in_flight must be at least 1, not {in_flight}")
        self.fn, self.collate, self.dataset, self.seed = fn, collate, dataset, seed
        self.workers, self.in_flight = workers, in_flight
        self.wait_seconds = 0.0
        self.batches = 0
        self._run = 0  # the current map() call; answers for an earlier, abandoned one are dropped
        self._closed = False
        self._broken: Optional[TransformError] = None
        self._procs: List[subprocess.Popen] = []  # worker 0, which forks and reaps the others
        self._socks: List[socket.socket] = []
        self._pids: List[Optional[int]] = []  # each worker's, once its first message is read
        # Per worker, (run, index, epoch) of each batch sent and not yet answered, in the order sent: a
        # worker answers in that order.
        self._sent: List[Deque[Tuple[int, int, int]]] = []
        self._finalizer = weakref.finalize(self, _stop, os.getpid(), self._procs, self._socks)
        if workers:
            payload = encode(self._pickled(fn, collate))
            try:
                self._start_workers(workers)
                for sock in self._socks:
                    send(sock, payload)
            except BaseException:
                self.close()
                raise

    def _pickled(self, fn, collate) -> bytes:
        import cloudpickle

        try:
            return cloudpickle.dumps((fn, collate, self.seed))
        except Exception as exc:
            raise TransformPickleError(
                f"dataset {self.dataset!r}: the transform {fn!r} (or its collate) cannot be pickled to send it "
                f"to the worker processes: {type(exc).__name__}: {exc}. Create what cannot be pickled (an open "
                "file, a lock, a client) inside the function on first use, or pass workers=0 to run the "
                "transform in the training process", self.dataset) from exc

    def _start_workers(self, workers: int) -> None:
        pairs = [socket.socketpair() for _ in range(workers)]
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
        self._procs.append(proc)
        for mine, _ in pairs:
            self._socks.append(mine)
            self._sent.append(deque())
            self._pids.append(None)

    def _pid(self, w: int) -> Optional[int]:
        """Worker ``w``'s process id: the first message on its socket, read here if it has not been yet (it
        comes before any answer). None when the worker died before sending it."""
        if self._pids[w] is None:
            try:
                _, self._pids[w] = recv(self._socks[w])
            except (EOFError, OSError):
                return None
        return self._pids[w]

    @property
    def pids(self) -> List[int]:
        """The worker processes' ids (empty with ``workers=0`` or once closed); waits for workers still
        starting."""
        if self._closed:
            return []
        return [pid for pid in map(self._pid, range(len(self._socks))) if pid is not None]

    def map(self, batches: Iterable[Any], *, epoch: int, start: int = 0) -> Iterator[Any]:
        """The transformed ``batches`` of ``epoch``, in their order; the first is batch ``start`` of the epoch
        (a loader resuming mid-epoch passes its position, so batch indexes and seeds stay those of the
        epoch). Starting another map abandons this one's iterator: it raises ``RuntimeError`` if resumed.

        Raises (from the iterator):
            TransformError: the transform raised (message: dataset, epoch, batch index, the worker's
                traceback) or returned something that is not a dict without a ``collate``; or a worker
                process died (the pool is then closed, and later calls raise it again).
            RuntimeError: the pool is closed.
        """
        if self._closed:
            raise self._broken or RuntimeError(f"dataset {self.dataset!r}: the transform workers are closed")
        self._run += 1
        if not self.workers:
            return self._inline(iter(batches), epoch, start, self._run)
        return self._parallel(iter(batches), epoch, start, self._run)

    def _error(self, epoch: int, index: int, summary: str, tb: str, where: str) -> TransformError:
        return TransformError(f"dataset {self.dataset!r}: the transform failed on batch {index} of epoch "
                              f"{epoch} ({where}): {summary}\n\n--- its traceback, {where} ---\n{tb}",
                              self.dataset, epoch, index, tb)

    def _check_current(self, run: int) -> None:
        if self._closed:
            raise self._broken or RuntimeError(f"dataset {self.dataset!r}: the transform workers are closed")
        if run != self._run:
            raise RuntimeError(f"dataset {self.dataset!r}: this iterator was abandoned: map() was called again")

    def _inline(self, it: Iterator, epoch: int, start: int, run: int) -> Iterator[Any]:
        index = start
        for batch in it:
            t0 = time.perf_counter()
            try:
                out = apply(self.fn, self.collate, batch, self.seed, epoch, index, keep_rng=True)
            except Exception as exc:
                raise self._error(epoch, index, traceback.format_exception_only(type(exc), exc)[-1].strip(),
                                  traceback.format_exc(), "in the training process") from exc
            del batch
            self.wait_seconds += time.perf_counter() - t0
            self.batches += 1
            yield out
            self._check_current(run)
            index += 1

    def _parallel(self, it: Iterator, epoch: int, start: int, run: int) -> Iterator[Any]:
        done: Dict[int, Any] = {}  # answers that came before an earlier batch's
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
                self._submit(run, epoch, taken, batch)
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
            self.wait_seconds += time.perf_counter() - t0 - upstream
            self.batches += 1
            yield out
            del out
            self._check_current(run)
            given += 1
            t0, upstream = time.perf_counter(), 0.0

    def _submit(self, run: int, epoch: int, index: int, batch: Any) -> None:
        try:
            parts = encode((run, index, epoch, batch))
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
        self._sent[w].append((run, index, epoch))

    def _collect(self, run: int, done: Dict[int, Any]) -> None:
        """Read the answers that are ready (waiting for one); keep this run's in ``done``."""
        busy = [self._socks[w] for w in range(self.workers) if self._sent[w]]
        for sock in _wait_any(busy):
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
            assert (sent_run, sent_index) == (answer_run, index), "a worker answered out of order"
            if answer_run != run:
                continue  # for an iterator abandoned before it got this far
            if kind == "ok":
                done[index] = rest[0]
            else:
                summary, tb = rest
                raise self._error(epoch, index, summary, tb, f"in worker process {self._pids[w]}")

    def _lost(self, w: int) -> None:
        """Worker ``w`` closed its socket: it died. Close the pool and raise :class:`TransformError`."""
        pid, code = self._pid(w), None
        if w == 0 or self._procs[0].poll() is not None:  # worker 0, or a worker that died with it
            pid = self._procs[0].pid
            try:
                code = self._procs[0].wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        elif pid is not None:
            code = forked_exit_code(pid, _STOP_GRACE_S)
        if code is None:
            how = "closed its connection"
        elif code < 0:
            how = f"was killed by signal {-code}" + (" (SIGKILL: often the out-of-memory killer)" if code == -9 else "")
        else:
            how = f"exited with code {code}"
        run, index, epoch = self._sent[w][0] if self._sent[w] else (None, None, None)
        doing = f" while transforming batch {index} of epoch {epoch}" if index is not None else ""
        self._broken = TransformError(f"dataset {self.dataset!r}: transform worker process {pid} {how}{doing}; "
                                      "its output above may say why", self.dataset, epoch, index)
        self.close()
        raise self._broken

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


def transformed(batches: Iterable[Any], fn: Callable[[Any], Any], *, workers: int, dataset: str, epoch: int,
                seed: int = 0, in_flight: Optional[int] = None, collate: Optional[Callable[[Any], Any]] = None,
                start: int = 0) -> Iterator[Any]:
    """One epoch through a :class:`TransformWorkers` of its own, closed when the iterator ends or is closed.
    Workers start on the first ``next()``; a loader that runs several epochs should keep one
    :class:`TransformWorkers` instead. Raises what :class:`TransformWorkers` and its ``map`` raise."""
    with TransformWorkers(fn, workers=workers, dataset=dataset, seed=seed, in_flight=in_flight,
                          collate=collate) as pool:
        yield from pool.map(batches, epoch=epoch, start=start)
