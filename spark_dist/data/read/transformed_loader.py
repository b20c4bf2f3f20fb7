"""A rank's loader whose batches pass through the user's ``transform`` (decode, tokenize, augment) on the way.

:class:`TransformedLoader` wraps a :class:`~spark_dist.data.read.loader.ShardLoader` that yields CPU batches and
hands them to :class:`~spark_dist.data.read.transform_workers.TransformWorkers` (``workers`` processes, or the
calling thread for ``workers=0``), then moves what comes back to the rank's device. The batch order, the
number of batches and the epoch order are the inner loader's, so epochs stay reproducible from
``(seed, epoch)``.

Its place in an epoch is its own, not the inner loader's: the workers hold up to ``in_flight`` batches that
the inner loader has yielded and the training loop has not seen yet, so :meth:`state_dict` counts the batches
this loader yielded, and each iteration reads the inner loader's batches from the place it starts at.

Each batch's transform is seeded from ``(seed, epoch, rank, batch)`` of the place the batch was made for (in
an epoch dealt out after a resize, an old rank's), with the loader's seed of the iteration: one restored by
:meth:`load_state_dict` takes effect.
"""
import contextlib
from typing import Any, Callable, Dict, Iterator, Optional

from . import dealt_epoch
from .loader_state import Resumable, counted
from .transform_workers import DEFAULT_TIMEOUT_S, TransformWorkers


def check_transform(transform, workers, collate) -> None:
    """Raises ValueError: ``workers`` is not an int >= 0, or ``collate`` is given without a ``transform``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"workers={workers!r}: need an int >= 0 (0 runs the transform in the loader's thread)")
    if collate is not None and transform is None:
        raise ValueError("collate= turns what transform= returns into a batch: pass a transform too")


class TransformedLoader(Resumable):
    """The batches of ``inner`` (a ``ShardLoader`` yielding CPU batches) with ``transform`` applied; see
    :func:`~spark_dist.data.make_loader`.

    ``len()``, :meth:`set_epoch`, ``sampler``, :meth:`state_dict` / :meth:`load_state_dict` behave as the inner
    loader's. ``wait_seconds`` adds the time the training loop waited on the transform to the inner loader's
    wait. The worker processes start at the first iteration and serve every epoch; :meth:`close` (or the
    loader's garbage collection, or the rank's exit) ends them.
    """

    def __init__(self, inner, transform: Callable[[Dict], Any], *, workers: int,
                 collate: Optional[Callable[[Any], Any]], device, in_flight: Optional[int] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_S):
        self._inner = inner
        self._transform, self._collate, self._workers, self._in_flight = transform, collate, workers, in_flight
        self._timeout = timeout
        self._pool: Optional[TransformWorkers] = None
        self.device = device
        self.handle, self.rank, self.world_size = inner.handle, inner.rank, inner.world_size
        self.batch_size, self.drop_last = inner.batch_size, inner.drop_last
        self.epoch, self.seed, self.shuffle = inner.epoch, inner.seed, inner.shuffle
        self.on_progress = None  # called with (epoch, batches yielded, len(self)) after each batch
        self.batches = self.rows = 0
        self._resume_at, self._at = None, (inner.epoch, 0)  # see Resumable

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def wait_seconds(self) -> float:
        return self._inner.wait_seconds + (self._pool.wait_seconds if self._pool is not None else 0.0)

    def _workers_pool(self) -> TransformWorkers:
        """The pool, started at the first iteration (so a loader made and never read starts no process)."""
        if self._pool is None:
            self._pool = TransformWorkers(self._transform, workers=self._workers, dataset=self.handle.name,
                                          in_flight=self._in_flight, collate=self._collate, timeout=self._timeout)
        return self._pool

    def __iter__(self) -> Iterator[Any]:
        # A generator, as the inner loader's: a set_epoch between iter() and the first next() still counts.
        epoch = self.epoch
        place, start, total = self._begin(epoch)
        inner = self._inner
        inner.seed, inner.shuffle, inner.epoch = self.seed, self.shuffle, epoch
        # Where each batch belongs in the epoch it was made for, which its seed follows (None: this rank's).
        origins = dealt_epoch.places(inner, *place) if isinstance(place, tuple) else None
        pool = self._workers_pool()
        # The inner loader's batches, not counted there: this loader's place is what the training loop got.
        with contextlib.closing(inner._placed(place)) as placed:
            out = pool.map((batch for _, batch in placed), epoch=epoch, start=start, rank=self.rank, seed=self.seed,
                           origins=origins)
            on_device = out if self.device is None else (_to_device(batch, self.device) for batch in out)
            yield from counted(self, epoch, on_device, start, total)

    def close(self) -> None:
        """End the worker processes (a later iteration starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown: the workers end with the rank anyway
            pass


def _to_device(batch: Any, device) -> Any:
    """Tensors of a transformed batch (a dict, or what ``collate`` made of it) moved to ``device``."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in batch):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch
