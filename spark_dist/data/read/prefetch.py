"""A generator's items made ahead of the consumer in a background thread, a bounded number at a time.

The loader reads and shuffles its windows this way (:mod:`.loader`): the thread runs while the training loop
works on the batches already made.
"""
import contextlib
import queue
import threading
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
_END = object()


def prefetched(items: Callable[[], Iterator[T]], *, depth: int, name: str,
               waited: Callable[[float], None]) -> Iterator[T]:
    """The items of ``items()``, which a thread named ``name`` iterates, at most ``depth`` of them made and not
    yet taken. ``waited`` is told the seconds the consumer waited for each item.

    Closing the iterator (or leaving a loop over it early) stops the thread and joins it: it ends at its next
    item, so no thread outlives the iteration.

    Raises:
        BaseException: what ``items()`` raised, in the consumer, after the items made before it.
    """
    out: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(target=_produce, args=(items, out, stop), daemon=True, name=name)
    thread.start()
    try:
        while True:
            t0 = time.perf_counter()
            item = out.get()
            waited(time.perf_counter() - t0)
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=10)


class _Raised:
    """What ``items()`` raised, on its way to the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


def _produce(items: Callable[[], Iterator], out: "queue.Queue", stop: threading.Event) -> None:
    try:
        # Closed on every way out, in this thread: whatever the generator holds (its own threads) ends here.
        with contextlib.closing(items()) as made:
            for item in made:
                if not _put(out, item, stop):
                    return
        _put(out, _END, stop)
    except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, raised there
        _put(out, _Raised(exc), stop)


def _put(out: "queue.Queue", item, stop: threading.Event) -> bool:
    """Put ``item`` unless the consumer went away (it stops iterating early: a ``break``)."""
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            out.put(item, timeout=0.1)
            return True
    return False
