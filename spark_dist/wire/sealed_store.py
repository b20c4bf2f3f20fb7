"""The run's store: one ``torch.distributed.TCPStore`` per attempt, with sealed, pickled values.

The driver hosts it (the first task, under Connect). Tasks join it as clients, publish where they run, and read
back the assignment computed for them: no Spark barrier sync on the launch path. ``init_process_group()`` joins
the same store (TORCHELASTIC_USE_AGENT_STORE). Values are sealed (encrypted and authenticated) with keys derived from a
per-attempt secret and opened before anything is unpickled; the keys sit under a prefix no one without the
secret can name.
"""
from __future__ import annotations

import errno
import functools
import pickle
import socket
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from ..errors import ConfigError
from .sealing import Sealer, prefix_token

_Bound = TypeVar("_Bound")
WOKEN_WAIT_S = 5.0  # wait_for: a wait this long or longer is woken by the store; a shorter one polls


def bind_listener(host: str, port: int = 0) -> socket.socket:
    """A listening socket on ``host`` only, on ``port`` (0: a free one). torch's TCPStore would listen on
    all interfaces whatever host it is given; binding here and passing the descriptor keeps it on one.

    Raises:
        OSError: ``port`` is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def bind_in_range(host: str, ports: Optional[Tuple[int, int]], key: str,
                  bind: Callable[[str, int], _Bound] = bind_listener) -> _Bound:
    """``bind(host, port)`` on the first free port of ``ports`` (``(first, last)``, both included, as the conf
    key ``key`` gave them, so that a firewall needs to open only those); ``ports=None``: port 0, any free one.

    Raises:
        ConfigError: naming ``key`` and the ports: every one is taken on ``host``, or one needs privileges.
        OSError: any other failure (``host`` is no address of this machine), at once: no port would help.
    """
    if ports is None:
        return bind(host, 0)
    first, last = ports
    for port in range(first, last + 1):
        try:
            return bind(host, port)
        except OSError as exc:
            if exc.errno == errno.EACCES:
                raise ConfigError(f"{key}: port {port} on {host} needs privileges this process lacks ({exc}); "
                                  "use ports above 1023") from None
            if exc.errno != errno.EADDRINUSE:
                raise
    if first == last:
        raise ConfigError(f"{key}={first}: port {first} is taken on {host}; free it, or give a range (for "
                          f"example {first}-{min(first + 100, 65535)}) so that another run or attempt can take "
                          "the next port")
    raise ConfigError(f"{key}={first}-{last}: every port of the range is taken on {host}; widen the range")


class SealedStore:
    """A TCPStore whose values are pickled and sealed (:mod:`spark_dist.wire.sealing`: AES-GCM under a key
    derived from ``secret``, bound to the value's key) under one key prefix that holds a random part derived
    from the secret.

    A peer who reaches the port without the secret can neither name the run's keys, nor read a value, nor
    write one that is opened: a value that does not open counts as absent and is never unpickled. Only the
    unsealed counters (:meth:`counter`) are anyone's to change, so they are hints, never decisions."""

    def __init__(self, store, secret: bytes, prefix: str):
        self.raw = store
        self._sealer = Sealer(secret)
        self._prefix = f"{prefix}/{prefix_token(secret)}"

    def key(self, name: str) -> str:
        return f"{self._prefix}/{name}"

    def _sealed(self, name: str, value) -> bytes:
        return self._sealer.seal(self.key(name), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def _opened(self, key: str, blob: bytes):
        """The value in ``blob`` if it was sealed under the store key ``key`` (:meth:`key` of its name) with this
        store's secret (opened before anything is unpickled), else ``FORGED``."""
        data = self._sealer.open_sealed(key, blob)
        return FORGED if data is None else pickle.loads(data)

    def put(self, name: str, value) -> None:
        self.raw.set(self.key(name), self._sealed(name, value))

    def get(self, name: str):
        """The value of ``name`` (which must exist).

        Raises:
            PermissionError: it is not a value we sealed (rejected unread).
        """
        key = self.key(name)
        value = self._opened(key, self.raw.get(key))
        if value is FORGED:
            raise PermissionError(f"store value {name!r} did not open with the run's key: rejected unread")
        return value

    def lookup(self, name: str, default=None):
        """The value of ``name`` when it holds one we sealed, else ``default`` (absent or forged alike)."""
        key = self.key(name)
        if not self.raw.check([key]):
            return default
        value = self._opened(key, self.raw.get(key))
        return default if value is FORGED else value

    def has(self, name: str) -> bool:
        """True when ``name`` holds a value we sealed; a forged one counts as absent."""
        return self.lookup(name, FORGED) is not FORGED

    def get_many(self, names: Sequence[str]) -> List[Any]:
        """The values of ``names`` (which must all exist) in one round trip; a forged one is ``FORGED``."""
        keys = [self.key(n) for n in names]
        return [self._opened(k, blob) for k, blob in zip(keys, self.raw.multi_get(keys))]

    def put_many(self, values: Dict[str, Any]) -> None:
        """``put`` for each name, in one round trip."""
        self.raw.multi_set([self.key(n) for n in values], [self._sealed(n, v) for n, v in values.items()])

    def delete(self, name: str) -> None:
        """Forget ``name`` (absent already is fine)."""
        self.raw.delete_key(self.key(name))

    def counter(self, name: str, increment: int = 1) -> int:
        """An unsealed counter: anyone who reaches the store and names its key can set it to anything, so
        callers use it only as a hint (whether to look) and never as a count of work to do, nor as a sign of
        life (beats and restart markers are sealed values)."""
        return int(self.raw.add(self.key(name), increment))

    # -- queues: the store log's records (see spark_dist.wire.store_log) ---------------------------------------
    def push(self, queue: str, value) -> None:
        """Append ``value``, sealed, to the FIFO ``queue``. The store applies a client's requests in order,
        so a later round trip on this client (``queue_len``) returns only once it is in."""
        self.raw.queue_push(self.key(queue), self._sealed(queue, value))

    def pop(self, queue: str):
        """The oldest value of ``queue``, removed from the store; ``EMPTY`` when there is none and ``FORGED``
        for a value we did not seal (removed unread all the same)."""
        key = self.key(queue)
        try:
            blob = self.raw.queue_pop(key, False)
        except _queue_empty():
            return EMPTY
        return self._opened(key, blob)

    def queue_len(self, queue: str) -> int:
        return int(self.raw.queue_len(self.key(queue)))

    def wait_for(self, name: str, timeout: float):
        """Wait until ``name`` holds a value we sealed and return it. A wait of :data:`WOKEN_WAIT_S` or more
        is woken by the store (no polling); a shorter one, and a forged value, are polled for.

        Raises:
            TimeoutError: no sealed value appeared within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pause = 0.005
        key = self.key(name)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waited {timeout:.0f}s for {name!r} in the run's store")
            if not self.raw.check([key]):
                # torch's store prints two warnings on every wait that times out: a short wait, which its
                # caller repeats as a matter of course, looks instead, so a console never fills with them.
                if timeout < WOKEN_WAIT_S:
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 0.05)
                    continue
                try:
                    self.raw.wait([key], timedelta(seconds=left))
                except Exception:  # noqa: BLE001 -- torch's DistStoreError on its timeout: checked above
                    continue
            value = self._opened(key, self.raw.get(key))
            if value is not FORGED:
                return value
            time.sleep(min(0.05, max(left, 0)))  # a forged value sits there: look again until ours replaces it


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name


EMPTY = _Marker("EMPTY")  # pop: the queue holds nothing
FORGED = _Marker("FORGED")  # a value that did not open: not sealed by us, or moved from another key


@functools.lru_cache(maxsize=None)
def _queue_empty():
    """torch's ``QueueEmptyError`` (imported on first use: this module loads without torch)."""
    from torch.distributed import QueueEmptyError

    return QueueEmptyError


def host_store(host: str, timeout: float, listener: Optional[socket.socket] = None):
    """Start a TCPStore server on ``host`` (on ``listener`` if given: a socket from :func:`bind_listener`,
    so the port can be handed out before torch is even imported); returns ``(store, port)``. The store owns
    the listening socket from here on: dropping the last reference to it closes the port. Clients that
    connect before the server runs wait in the listen backlog."""
    from torch.distributed import TCPStore

    listener = listener or bind_listener(host)
    port = listener.getsockname()[1]
    store = TCPStore(
        own_address(host), port, None, True, timedelta(seconds=timeout), wait_for_workers=False,
        master_listen_fd=listener.fileno(),
    )
    listener.detach()
    return store, port


def own_address(bind_host: str) -> str:
    """Where this process's own clients reach a server it binds on ``bind_host`` (loopback for a wildcard)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_host, bind_host)


def join_store(host: str, port: int, timeout: float):
    """A client of the run's store.

    Raises:
        RuntimeError / TimeoutError from torch when the driver cannot be reached.
    """
    from torch.distributed import TCPStore

    return TCPStore(host, port, None, False, timedelta(seconds=timeout))
