"""The worker-process side of :mod:`.transform_workers`: how a batch is transformed and seeded, the message
framing both sides use, and a worker's main loop.

:class:`~.transform_workers.TransformWorkers` starts one fresh interpreter as
``python -c BOOT <socket fds> <parent pid> <die-with-parent flag> <sys.path as JSON>``: it imports torch,
then forks the other workers from itself and serves the first socket as worker 0 (:func:`workers_main`), so
that the k workers share one copy of torch's import (a fork is safe there: the interpreter is new, with no
CUDA, process group or thread of the rank's). Each worker talks to the rank over its own Unix socket: it
first sends ``("pid", its pid)``, then receives the pickled ``(fn, collate)``, then ``(run, index, seed,
batch)`` messages (``seed``: the batch's :func:`seed_for`, worked out by the rank), each answered in the order
received with ``("ok", run, index, output)`` or ``("error", run, index, summary, traceback text)``.

Framing: a message is pickled with protocol 5; numpy arrays travel as out-of-band buffers and CPU tensors as
numpy views of their memory, so a batch of images is written from its own memory and read straight into
the buffers the tensors are then built on (no intermediate copy of the payload on either side).
"""
import hashlib
import io
import os
import pickle
import queue
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Mapping, Optional

import numpy as np

from ...host import parent_death

# Run by the new interpreter: it needs only the standard library until sys.path is the rank's.
BOOT = ("import json, sys\n"
        "sys.path[:] = json.loads(sys.argv[4])\n"
        "from spark_dist.data.read.transform_process import workers_main\n"
        "workers_main([int(fd) for fd in sys.argv[1].split(',')], int(sys.argv[2]), sys.argv[3] == '1')\n")

_PARENT_POLL_S = 1.0    # how often a worker checks that the rank is still its parent
_REAP_GRACE_S = 3.0     # worker 0's exit: how long the workers it forked get to exit before they are killed
_forked: List[int] = []  # in worker 0: the workers it forked, reaped when it exits
_state = threading.local()  # .seed: the seed of the batch being transformed in this thread


# -- seeding -------------------------------------------------------------------------------------------------
def seed_for(seed: int, epoch: int, rank: int, index: int) -> int:
    """The seed of batch ``index`` of ``rank``'s share of ``epoch``: a hash of the four, below 2**32 (what
    ``np.random.seed`` takes). A hash rather than arithmetic, so neighbouring batches, ranks and epochs get
    unrelated streams. ``(rank, index)`` name the batch in the epoch it was made for: a batch dealt out to
    another rank after a resize keeps its seed, so it draws what the uninterrupted epoch drew."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def batch_seed() -> int:
    """The seed of the batch being transformed, for a transform that makes its own generator
    (``np.random.default_rng(batch_seed())``, ``torch.Generator().manual_seed(batch_seed())``).

    Raises:
        RuntimeError: called outside a transform.
    """
    seed = getattr(_state, "seed", None)
    if seed is None:
        raise RuntimeError("batch_seed() is only available inside a transform run by TransformWorkers")
    return seed


def _seed_globals(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.random.default_generator.manual_seed(seed)  # the CPU generator only: see apply()


def apply(fn: Callable, collate: Optional[Callable], batch: Any, seed: int, *, keep_rng: bool = False) -> Any:
    """``collate(fn(batch))`` (or ``fn(batch)``, which must then be a mapping) with the global generators of
    ``random``, ``numpy.random`` and torch's CPU generator seeded with ``seed`` (the batch's :func:`seed_for`).

    ``keep_rng``: put those generators back as they were afterwards; used when ``fn`` runs in the rank's own
    thread (``workers=0``), whose training loop must not see its random streams moved by the transform. CUDA
    generators are never seeded: that would initialise CUDA in a worker, and in the rank it would change the
    training loop's GPU random stream.

    Raises:
        TypeError: ``fn`` returned something that is not a mapping and there is no ``collate``.
        Exception: whatever ``fn`` or ``collate`` raise.
    """
    import torch

    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state()) if keep_rng else None
    _state.seed = seed
    try:
        _seed_globals(seed)
        out = fn(batch)
        if collate is not None:
            return collate(out)
        if not isinstance(out, Mapping):
            raise TypeError(f"the transform returned a {type(out).__name__}, not a dict of column -> tensor; "
                            "return a dict, or pass collate= to turn what it returns into the batch")
        return out
    finally:
        _state.seed = None
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


# -- framing ---------------------------------------------------------------------------------------------
def _tensor_from_numpy(array: np.ndarray):
    import torch

    return torch.from_numpy(array)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        # A plain CPU tensor as a numpy view of its memory: numpy's protocol-5 reduction then hands that
        # memory to buffer_callback instead of copying it into the pickle (torch's own reduction serialises
        # the whole storage, even of a small view). Other tensors (bfloat16, which numpy lacks; on a GPU;
        # needing grad) take torch's reduction.
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" \
                and obj.layout == torch.strided and not obj.requires_grad:
            try:
                return _tensor_from_numpy, (obj.numpy(),)
            except (TypeError, RuntimeError):
                pass
        return NotImplemented


def encode(obj: Any) -> List[memoryview]:
    """``obj`` as the parts of one message (header, pickle, out-of-band buffers), ready for :func:`send`.

    Raises whatever pickling ``obj`` raises, before anything is written: the stream stays intact.
    """
    buffers: List[pickle.PickleBuffer] = []
    data = io.BytesIO()
    _Pickler(data, protocol=5, buffer_callback=buffers.append).dump(obj)
    views = [b.raw() for b in buffers]  # numpy only hands over contiguous buffers
    sizes = [data.getbuffer().nbytes] + [v.nbytes for v in views]
    header = struct.pack(f"<Q{len(sizes)}Q", len(sizes), *sizes)
    return [memoryview(header), data.getbuffer()] + views


def send(sock, parts: List[memoryview]) -> None:
    """Write an :func:`encode`-d message. Raises ``OSError`` when the other side has gone."""
    for part in parts:
        sock.sendall(part)


def _read_into(sock, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("the other side closed the connection")
        view = view[n:]


def recv(sock) -> Any:
    """Read one message. Raises ``EOFError`` or ``OSError`` when the other side has gone."""
    count = bytearray(8)
    _read_into(sock, memoryview(count))
    (n,) = struct.unpack("<Q", count)
    sizes = bytearray(8 * n)
    _read_into(sock, memoryview(sizes))
    parts = [bytearray(size) for size in struct.unpack(f"<{n}Q", sizes)]
    for part in parts:
        _read_into(sock, memoryview(part))
    # The buffers are fresh bytearrays: the arrays and tensors built on them are writable and own no one
    # else's memory.
    return pickle.loads(parts[0], buffers=parts[1:])


# -- the worker's main loop ------------------------------------------------------------------------------
def _reap(pids: List[int], grace: float) -> None:
    """Wait for ``pids`` (this process's children) to exit, killing those still alive after ``grace`` seconds,
    so that none outlives worker 0: the rank's ``close()`` joins worker 0 alone."""
    deadline = time.monotonic() + grace
    left = list(pids)
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.remove(pid)
        if left and time.monotonic() >= deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        elif left:
            time.sleep(0.01)


def forked_exit_code(pid: int, timeout: float) -> Optional[int]:
    """The exit code (negative: the signal) of ``pid``, a worker forked by worker 0, as ``Popen.returncode``
    gives one: the rank cannot wait for a process that is not its child, but Linux shows a dead child's
    status (``/proc/<pid>/stat``, field 52) until its parent reaps it, which worker 0 does only when it exits.
    None when it does not show within ``timeout`` seconds (still exiting, or not Linux)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if fields[0] == "Z" and len(fields) > 49:
            status = int(fields[49])  # field 52; fields[0] is field 3
            return -(status & 0x7F) if status & 0x7F else status >> 8
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 -- exiting anyway
            pass
    _reap(_forked, _REAP_GRACE_S)
    os._exit(0)


def _receive(sock, inbox: "queue.SimpleQueue", parent_pid: int) -> None:
    """The receiving thread: moves messages to ``inbox`` as they come, so the rank's writes never wait for
    the transform in progress (and the two sides can never both block writing to each other). Ends the
    process on end of file (the rank closed the pool, or died) or once the rank is no longer its parent, even
    while a transform is running in the main thread."""
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], _PARENT_POLL_S)
            if ready:
                inbox.put(recv(sock))
            elif os.getppid() != parent_pid:
                break
    except BaseException:  # noqa: BLE001 -- end of file or a broken stream: the rank is done with us
        pass
    _exit_now()


def workers_main(fds: List[int], parent_pid: int, die_with_parent: bool) -> None:
    """Worker 0's life (the interpreter the rank started): import torch, fork a worker for each socket in
    ``fds[1:]``, then serve ``fds[0]``. Each forked worker shares the pages of that import until it writes to
    them, dies with worker 0 (which reaps it before it exits), and closes every socket but its own, so that
    the rank sees end of file on a worker's socket exactly when that worker is gone."""
    if die_with_parent:
        # Only when the rank's main thread started the pool: the kernel signals at the end of the creating
        # thread, not the process. The socket's end of file and the parent-pid poll in _receive cover the rest.
        parent_death.die_with_parent()
    if os.getppid() != parent_pid:  # the rank died before the line above took effect
        _exit_now()
    # Ctrl-C in a terminal reaches the whole process group: the rank handles it (and closes the pool); a
    # worker stopped by it mid-batch would only report a second, misleading error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import cloudpickle  # noqa: F401 -- what unpickling the transform needs, imported once for every worker
    import torch

    # As torch's DataLoader workers do: k workers with one intra-op thread each, not k times the cores.
    torch.set_num_threads(1)
    socks = [socket.socket(fileno=fd) for fd in fds]
    me, forked = os.getpid(), []
    for sock in socks[1:]:
        pid = os.fork()
        if pid == 0:
            try:
                for other in socks:
                    if other is not sock:
                        other.close()
                parent_death.die_with_parent()
                worker_main(sock, me)
            finally:
                os._exit(1)  # worker_main ends the process itself; never return into worker 0's loop
        forked.append(pid)
    for sock in socks[1:]:
        sock.close()
    _forked[:] = forked
    worker_main(socks[0], parent_pid)


def worker_main(sock, parent_pid: int) -> None:
    """A worker process's life: say its pid, load the transform, then transform batches in the order they
    arrive. Ends the process."""
    if os.getppid() != parent_pid:  # the parent died before its death signal was asked for
        _exit_now()
    try:
        send(sock, encode(("pid", os.getpid())))
    except OSError:
        _exit_now()
    inbox: "queue.SimpleQueue" = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(sock, inbox, parent_pid), name="receive", daemon=True).start()
    try:
        fn, collate = pickle.loads(inbox.get())
    except BaseException as exc:  # noqa: BLE001 -- reported to the rank with every batch it sends
        failure = (f"the transform could not be loaded in the worker process: {_summary(exc)}",
                   traceback.format_exc())
        fn = collate = None
    else:
        failure = None
    while True:
        run, index, seed, batch = inbox.get()
        try:
            if failure is not None:
                parts = encode(("error", run, index) + failure)
            else:
                parts = encode(("ok", run, index, apply(fn, collate, batch, seed)))
        except BaseException as exc:  # noqa: BLE001 -- fn's error (or an output that cannot be pickled)
            parts = encode(("error", run, index, _summary(exc), traceback.format_exc()))
        del batch
        try:
            send(sock, parts)
        except OSError:
            _exit_now()


def _summary(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()
