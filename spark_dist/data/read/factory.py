"""``make_loader``: a rank's loader of a cached dataset, its options checked. The loader reads the rank's share
(:class:`~.loader.ShardLoader`); with a ``transform``, a :class:`~.transformed_loader.TransformedLoader` runs it
on each batch."""
from typing import Dict, Optional, Sequence

from ..handle import DatasetError, DatasetHandle
from .column_options import check_sizes, resolve
from .loader import ShardLoader
from .transform_errors import check_timeout
from .transform_workers import DEFAULT_TIMEOUT_S
from .transformed_loader import TransformedLoader, check_transform


def make_loader(handle: DatasetHandle, *, rank: int, world_size: int, batch_size: int, epoch: int = 0,
                shuffle: bool = True, seed: int = 0, columns: Optional[Sequence[str]] = None,
                drop_last: bool = True, device=None, dtypes: Optional[Dict] = None, pad=None,
                pad_side: str = "right", ragged: Sequence[str] = (), shapes: Optional[Dict] = None, transform=None,
                workers: int = 0, collate=None, timeout: Optional[float] = DEFAULT_TIMEOUT_S):
    """This rank's share of ``handle`` for one epoch, as batches: dicts of column name -> ``torch.Tensor`` (or a
    list, for the kinds below that are no tensor).

    Every rank yields exactly ``len(loader)`` batches, whatever the file and row-group layout, and no row
    goes to two ranks in one epoch. The order depends only on ``(seed, epoch)`` (and ``rank`` inside the
    rank), so a retry replays it exactly; every column of a batch holds the same rows. ``columns`` picks
    columns (default: all, in the dataset's order). What a batch holds of each column kind:

    - numbers: a 1-D tensor ``[batch]``; arrays of one length and ML vectors: ``[batch, length]``; nested
      arrays (``array<array<float>>``, one shape, checked by the write): ``[batch, *shape]``. ``shapes``
      (column -> tuple) gives an array, vector or nested column another shape of the same size, e.g.
      ``shapes={"pixels": (3, 8, 8)}`` for 192 values a row: ``[batch, 3, 8, 8]``.
    - floating values come as float32, integers as int64, booleans as bool, unless ``dtypes`` (column -> torch
      or numpy dtype) says otherwise.
    - arrays of numbers whose rows differ in length (a ``"sequence"`` column): a tensor ``[batch, longest in
      the batch]`` padded with ``pad`` (a number for every sequence column, or column -> number; default 0)
      after each row's values (``pad_side="right"``) or before them (``"left"``), and beside it the int64
      tensor ``[batch]`` of each row's length, under ``"<column>_lengths"``. A column named in ``ragged``
      comes as a list of 1-D tensors instead, one per row, with no lengths entry.
    - ``binary``: a list of ``bytes`` (images, audio: decode them in the loop); ``string``: a list of ``str``.

    ``drop_last=True``: each rank gets ``num_rows // world_size`` rows and yields only full batches (the last
    partial batch, if any, is dropped). ``drop_last=False``: each rank gets ``ceil(num_rows / world_size)``
    rows, the last ranks padding with up to ``world_size - 1`` rows repeated from the start of the epoch, so
    every row is seen at least once; the last batch may be smaller, and is the same size on every rank.

    Epochs: ``loader.set_epoch(e)`` (or ``loader.sampler.set_epoch(e)``, which Lightning calls at each epoch's
    start) picks the epoch the next iteration yields. ``loader.state_dict()`` is the place in the epoch (the
    batches already yielded); ``loader.load_state_dict(state)`` makes the next iteration yield the rest of
    that epoch, batch for batch as an uninterrupted one, for a checkpoint taken mid-epoch.

    ``transform`` (batch -> dict of tensors) runs on each batch in ``workers`` processes (0: this thread), order
    kept; ``collate`` makes its result a batch where a dict does not fit (:mod:`.transformed_loader`).
    ``timeout``: the seconds a worker may spend on one batch (default 600; None: no limit; as torch's
    ``DataLoader(timeout=)``, it applies to ``workers`` >= 1 only); past it the workers are stopped and the
    iteration raises ``TransformError`` naming the worker, the batch and the epoch.

    With ``device`` a CUDA device, tensors are pinned in the background thread and copied asynchronously.

    Raises:
        ValueError: ``rank``, ``world_size``, ``batch_size``, ``workers`` or ``timeout`` out of range,
            ``pad_side`` neither ``"right"`` nor ``"left"``, or ``collate`` without ``transform``.
        DatasetError: a column in ``columns``, ``dtypes``, ``pad``, ``ragged`` or ``shapes`` is not in the
            dataset (or not loaded), a dtype is not one, an option names a column of a kind it does not apply
            to (``dtypes`` a binary or string one, ``pad`` or ``ragged`` one that is not a sequence, ``shapes``
            one that is not an array, vector or nested array), a shape of another size than the column's, a
            padded column ``c`` loaded beside a column named ``c_lengths``, or the rank's share is smaller than
            one batch with ``drop_last=True`` (it would yield nothing).
    """
    if not isinstance(handle, DatasetHandle):
        raise TypeError(f"make_loader needs a DatasetHandle from prepare_datasets, got {type(handle).__name__}")
    check_sizes(rank, world_size, batch_size)
    names = list(handle.column_names if columns is None else columns)
    if not names:
        raise DatasetError(f"dataset {handle.name!r}: columns= is empty; name at least one column")
    infos = [handle.column(c) for c in names]  # raises DatasetError naming a missing column
    options = resolve(handle, infos, dtypes, pad, pad_side, ragged, shapes)
    check_transform(transform, workers, collate)
    check_timeout(timeout, handle.name)
    loader = ShardLoader(handle, rank=rank, world_size=world_size, batch_size=batch_size, epoch=epoch,
                         shuffle=shuffle, seed=seed, columns=names, drop_last=drop_last,
                         device=None if transform is not None else device, options=options)
    if len(loader) == 0:
        raise DatasetError(
            f"dataset {handle.name!r} has {handle.num_rows} rows: {loader.rows_per_rank} per rank over "
            f"{world_size} ranks, fewer than batch_size={batch_size}, so drop_last=True would yield no batch; "
            "lower batch_size or pass drop_last=False")
    if transform is None:
        return loader
    return TransformedLoader(loader, transform, workers=workers, collate=collate, device=device, timeout=timeout)
