"""The rank side: this rank's equal share of a cached dataset, as batches of torch tensors.

No Spark here, only the Parquet files the driver's Petastorm converter wrote.

Why not Petastorm's reader (``make_batch_reader`` / ``make_torch_dataloader``): it shards by row group,
round robin, so 1,000 rows in 10 row groups over 3 ranks gives 400/300/300 rows and DDP hangs on the
rank with more batches; its worker pool returns row groups in no fixed order, so an epoch cannot be
reproduced; and it is much slower than a plain pyarrow read on array columns (see BENCHMARKS.md, Data
loading; bench/bench_data.py). So the Petastorm converter owns the cache
and this module reads the cache's files with pyarrow: whole columns at a time, list values reshaped
without a copy, no per-row Python.

The epoch order (:func:`shard_pieces`, :func:`block_runs`): the row groups of all files in a permuted order,
and inside each row group its blocks of 256 rows in a permuted order, both from ``(seed, epoch)`` only.
Rank ``r`` takes positions ``[r*n, (r+1)*n)`` of that order, so ranks never overlap and every rank gets
exactly ``n`` rows whatever the file layout. Inside a rank, rows are shuffled again one by one across a
window of about 16 MiB (two of the cache's row groups) while they are copied out of pyarrow's buffers: that
copy is the only one, and a batch is a view of it. Two more threads decode the next row groups meanwhile.
"""
import math
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .arrays import default_dtype, list_values, numpy_dtype, rows_view, to_numpy, torch_dtype
from .epoch_order import block_runs, merged, shard_pieces
from .handle import SCALAR, DatasetError, DatasetHandle, open_parquet

_WINDOW_BYTES = 16 << 20     # rows shuffled together inside a rank; with the cache's 8 MiB row groups this bounds a
#                              rank's peak memory growth whatever the dataset's size (bench/bench_scaling.py)
_READ_CHUNK_ROWS = 4096      # rows pyarrow decodes at a time
_DECODE_THREADS = True       # pyarrow decodes the columns of a chunk in parallel (faster: bench_data.py)
_PREFETCH_WINDOWS = 2        # windows gathered ahead of the consumer by the background thread
_DECODE_WORKERS = 2          # threads decoding row groups, each its own (see ShardLoader._windows)
_DECODE_AHEAD = 4            # row groups decoded ahead of the window being gathered
_END = object()


class ShardLoader:
    """An iterable over this rank's batches of one epoch; see :func:`make_loader`.

    ``len(loader)`` is the number of batches, the same on every rank. Iterating again replays the same
    epoch; :meth:`set_epoch` moves to another. Timing, summed over all iterations so far:
    ``wait_seconds`` (the consumer waited for data), ``read_seconds`` (the background thread read and
    shuffled), ``batches`` and ``rows`` yielded.
    """

    def __init__(self, handle: DatasetHandle, *, rank: int, world_size: int, batch_size: int, epoch: int,
                 shuffle: bool, seed: int, columns: Sequence[str], drop_last: bool, device, dtypes: Dict):
        self.handle, self.rank, self.world_size, self.batch_size = handle, rank, world_size, batch_size
        self.epoch, self.shuffle, self.seed, self.drop_last = epoch, shuffle, seed, drop_last
        self.columns = [handle.column(c) for c in columns]
        self.device = device
        self._torch_dtypes = {c.name: dtypes[c.name] for c in self.columns}
        self._np_dtypes = {c: numpy_dtype(t) for c, t in self._torch_dtypes.items()}
        self._groups = [(f, g) for f, rows in enumerate(handle.row_group_rows) for g in range(len(rows))]
        self._group_rows = [n for rows in handle.row_group_rows for n in rows]
        row_bytes = sum(np.dtype(c.dtype).itemsize * (c.length or 1) for c in self.columns)
        self._window_rows = max(batch_size, _WINDOW_BYTES // max(row_bytes, 1))
        self.wait_seconds = self.read_seconds = 0.0
        self.batches = self.rows = 0
        self.on_progress = None  # called with (epoch, batches yielded, len(self)) after each batch

    @property
    def rows_per_rank(self) -> int:
        n = self.handle.num_rows
        return n // self.world_size if self.drop_last else -(-n // self.world_size)

    def __len__(self) -> int:
        n = self.rows_per_rank
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    # -- the background thread's side ------------------------------------------------------------------
    def _decode(self, group: int):
        """One row group as ``(chunk_starts, {column: [numpy chunk, ...]})``, views of pyarrow's buffers.

        The file is opened (memory-mapped) for this row group only: a mapping kept open for the epoch would
        hold every page it ever read in the rank's resident memory, the whole dataset by the epoch's end.
        """
        f, g = self._groups[group]
        parquet_file = open_parquet(self.handle.file_urls[f])
        chunks: Dict[str, list] = {c.name: [] for c in self.columns}
        starts = [0]
        # Small batches rather than read_row_group: pyarrow decodes list columns with less CPU in cache-sized
        # pieces, and no row group ever needs one contiguous buffer.
        for rb in parquet_file.iter_batches(batch_size=_READ_CHUNK_ROWS, row_groups=[g],
                                        columns=[c.name for c in self.columns], use_threads=_DECODE_THREADS):
            for c in self.columns:
                arr = rb.column(c.name)
                if c.kind == SCALAR:
                    chunks[c.name].append(to_numpy(arr))
                    continue
                # The list's values as one flat buffer, reshaped: no per-row work and no copy.
                flat = list_values(arr)
                if flat.size != len(arr) * c.length:
                    raise DatasetError(f"dataset {self.handle.name!r}: column {c.name!r} in "
                                       f"{self.handle.file_urls[f]} does not hold {c.length} values in every row")
                chunks[c.name].append(flat.reshape(len(arr), c.length))
            starts.append(starts[-1] + rb.num_rows)
        return np.asarray(starts), chunks

    def _runs(self) -> Iterator[Tuple[int, int, int]]:
        """This rank's rows in epoch order, as ``(row_group, first, end)`` runs."""
        pieces, _ = shard_pieces(self._group_rows, world_size=self.world_size, rank=self.rank, epoch=self.epoch,
                                 seed=self.seed, shuffle=self.shuffle, drop_last=self.drop_last)
        for group, start, stop in pieces:
            for first, end in block_runs(self.seed, self.epoch, group, self._group_rows[group], start, stop,
                                         self.shuffle):
                yield group, first, end

    def _window_runs(self) -> Iterator[List[Tuple[int, int, int]]]:
        """The runs cut into windows of ``_window_rows`` rows (the last one shorter). The first two windows of
        an epoch are a quarter and a half of that: the first batch waits for the first window's row groups
        and its shuffling copy, and a training loop waits for the first batch."""
        sizes = iter((max(self.batch_size, self._window_rows // 4), max(self.batch_size, self._window_rows // 2)))
        window, size, limit = [], 0, next(sizes)
        for group, first, end in self._runs():
            while first < end:
                take = min(end - first, limit - size)
                window.append((group, first, first + take))
                size, first = size + take, first + take
                if size == limit:
                    yield window
                    window, size, limit = [], 0, next(sizes, self._window_rows)
        if window:
            yield window

    def _gather(self, decoded: dict, runs, carry: Optional[Dict[str, np.ndarray]], window: int):
        """Copy the runs' rows (after ``carry``) into one fresh array per column, shuffled as they land.

        The one copy a row gets: out of pyarrow's buffers, into its place in the window, cast on the way.
        """
        kept = len(next(iter(carry.values()))) if carry else 0
        total = sum(end - first for _, first, end in runs)
        dest = (np.random.default_rng([self.seed, self.epoch, 2, self.rank, window]).permutation(total) + kept
                if self.shuffle else None)
        out = {c.name: np.empty((kept + total,) + ((c.length,) if c.length else ()),
                                dtype=self._np_dtypes[c.name] or c.dtype) for c in self.columns}
        if kept:
            for name, arr in out.items():
                arr[:kept] = carry[name]
        if dest is not None:
            # The window's order is random anyway: place its rows by chunk of pyarrow's output, one copy call
            # per chunk and column instead of one per block (the Python loop was the cost, not the copy).
            runs = merged(runs)
        # Where a column keeps its dtype, each row is moved as one opaque value (a numpy void of the row's
        # bytes) by np.put: less CPU than numpy's fancy assignment of 2-D rows, which walks every element (see
        # BENCHMARKS.md, Data loading).
        as_rows = {c.name: rows_view(out[c.name]) for c in self.columns
                   if dest is not None and np.dtype(c.dtype) == out[c.name].dtype}
        at = 0
        for group, first, end in runs:
            starts, chunks = decoded[group]
            k = int(np.searchsorted(starts, first, side="right")) - 1
            while first < end:
                stop = min(end, int(starts[k + 1]))
                n, base = stop - first, int(starts[k])
                where = dest[at:at + n] if dest is not None else slice(kept + at, kept + at + n)
                for name, arr in out.items():
                    part = chunks[name][k][first - base:stop - base]
                    if name in as_rows:
                        np.put(as_rows[name], where, rows_view(part))
                    else:
                        arr[where] = part
                at, first, k = at + n, stop, k + 1
        return out

    def _windows(self) -> Iterator[List[Dict]]:
        """Lists of batches (dicts of CPU tensors), one list per shuffle window.

        Row groups are decoded by ``_DECODE_WORKERS`` threads, one row group each, up to ``_DECODE_AHEAD``
        row groups ahead of the window being gathered: decoding (pyarrow, no GIL) and the shuffling copy
        (numpy, no GIL) then run on two cores at once instead of one after the other. Why two decoding threads
        and four row groups ahead: with one thread and one ahead, the decoding thread, slowed by the copy's
        memory traffic on the other core, set the pace, and the copy waited for it (see BENCHMARKS.md, Data
        loading; bench/bench_data.py). A decoded row group is dropped after the last window that takes rows
        from it.
        """
        import torch

        pin = self.device is not None and torch.device(self.device).type == "cuda"
        plan = list(self._window_runs())  # metadata only: every window's runs, known before any read
        need_order, last_use = [], {}
        for index, runs in enumerate(plan):
            for group, _, _ in runs:
                if group not in last_use:
                    need_order.append(group)
                last_use[group] = index
        decoder = ThreadPoolExecutor(_DECODE_WORKERS,
                                     thread_name_prefix=f"spark_dist-decode-{self.handle.name}-rank{self.rank}")
        pending: Dict[int, "Future"] = {}
        submitted = 0
        carry, bs = None, self.batch_size
        try:
            for index, runs in enumerate(plan):
                t0 = time.perf_counter()
                wanted = {group for group, _, _ in runs}
                # This window's row groups, then up to _DECODE_AHEAD more in the order windows need them.
                while submitted < len(need_order) and (
                        need_order[submitted] in wanted or
                        sum(1 for g in pending if g not in wanted) < _DECODE_AHEAD):
                    group = need_order[submitted]
                    pending[group] = decoder.submit(self._decode, group)
                    submitted += 1
                decoded = {group: pending[group].result() for group in wanted}
                rows = self._gather(decoded, runs, carry, index)
                del decoded
                for group in wanted:
                    if last_use[group] == index:
                        del pending[group]
                n = len(next(iter(rows.values())))
                last = index == len(plan) - 1  # the last window keeps its partial batch
                cut = n if last and not self.drop_last else n // bs * bs
                batches = [self._to_torch(rows, s, min(s + bs, cut), pin) for s in range(0, cut, bs)]
                carry = None if cut == n else {c: a[cut:] for c, a in rows.items()}
                self.read_seconds += time.perf_counter() - t0
                yield batches
        finally:
            decoder.shutdown(wait=True, cancel_futures=True)

    def _to_torch(self, rows, start: int, stop: int, pin: bool) -> Dict:
        import torch

        batch = {}
        for c, a in rows.items():
            t = torch.from_numpy(a[start:stop])  # a view of the window: no copy
            if self._np_dtypes[c] is None:
                t = t.to(self._torch_dtypes[c])
            batch[c] = t.pin_memory() if pin else t
        return batch

    def _produce(self, out: "queue.Queue", stop: threading.Event) -> None:
        try:
            for item in self._windows():
                if not _put(out, item, stop):
                    return
            _put(out, _END, stop)
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, raised there
            _put(out, exc, stop)

    # -- the consumer's side ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Dict]:
        expected = len(self)
        out: "queue.Queue" = queue.Queue(maxsize=_PREFETCH_WINDOWS)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(out, stop), daemon=True,
                                  name=f"spark_dist-loader-{self.handle.name}-rank{self.rank}")
        thread.start()
        yielded = 0
        try:
            while True:
                t0 = time.perf_counter()
                item = out.get()
                self.wait_seconds += time.perf_counter() - t0
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                for batch in item:
                    if self.device is not None:
                        batch = {c: t.to(self.device, non_blocking=True) for c, t in batch.items()}
                    yielded += 1
                    self.batches += 1
                    self.rows += len(next(iter(batch.values())))
                    if self.on_progress is not None:
                        self.on_progress(self.epoch, yielded, expected)
                    yield batch
            if yielded != expected:  # would hang DDP on the other ranks: fail loudly instead
                raise RuntimeError(f"dataset {self.handle.name!r}: rank {self.rank} yielded {yielded} batches, "
                                   f"expected {expected}; the cache files changed since prepare_datasets?")
        finally:
            stop.set()
            thread.join(timeout=10)


def _put(out: "queue.Queue", item, stop: threading.Event) -> bool:
    """Put ``item`` unless the consumer went away (it stops iterating early: a ``break``)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def make_loader(handle: DatasetHandle, *, rank: int, world_size: int, batch_size: int, epoch: int = 0,
                shuffle: bool = True, seed: int = 0, columns: Optional[Sequence[str]] = None,
                drop_last: bool = True, device=None, dtypes: Optional[Dict] = None) -> ShardLoader:
    """This rank's share of ``handle`` for one epoch, as batches: dicts of column name -> ``torch.Tensor``.

    Every rank yields exactly ``len(loader)`` batches, whatever the file and row-group layout, and no row
    goes to two ranks in one epoch. The order depends only on ``(seed, epoch)`` (and ``rank`` inside the
    rank), so a retry replays it exactly. Scalar columns come as 1-D tensors, array and vector columns as
    2-D ``[batch, length]``; floating columns as float32, integer ones as int64, unless ``dtypes`` (column ->
    torch or numpy dtype) says otherwise. ``columns`` picks columns (default: all, in the dataset's order).

    ``drop_last=True``: each rank gets ``num_rows // world_size`` rows and yields only full batches (the last
    partial batch, if any, is dropped). ``drop_last=False``: each rank gets ``ceil(num_rows / world_size)``
    rows, the last ranks padding with up to ``world_size - 1`` rows repeated from the start of the epoch, so
    every row is seen at least once; the last batch may be smaller, and is the same size on every rank.

    With ``device`` a CUDA device, batches are pinned in the background thread and copied asynchronously.

    Raises:
        ValueError: ``rank``, ``world_size`` or ``batch_size`` out of range.
        DatasetError: a column in ``columns`` or ``dtypes`` is not in the dataset, a dtype is not one, or
            the rank's share is smaller than one batch with ``drop_last=True`` (it would yield nothing).
    """
    if not isinstance(handle, DatasetHandle):
        raise TypeError(f"make_loader needs a DatasetHandle from prepare_datasets, got {type(handle).__name__}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size}: need 0 <= rank < world_size")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: need batch_size >= 1")
    names = list(handle.column_names if columns is None else columns)
    if not names:
        raise DatasetError(f"dataset {handle.name!r}: columns= is empty; name at least one column")
    infos = [handle.column(c) for c in names]  # raises DatasetError naming a missing column
    dtypes = dict(dtypes or {})
    for c in dtypes:
        if c not in names:
            raise DatasetError(f"dataset {handle.name!r}: dtypes names column {c!r}, which is not loaded; "
                               f"loaded columns: {', '.join(names)}")
    resolved = {c.name: (torch_dtype(dtypes[c.name], c.name, handle.name) if c.name in dtypes
                         else default_dtype(c.dtype)) for c in infos}
    loader = ShardLoader(handle, rank=rank, world_size=world_size, batch_size=batch_size, epoch=epoch,
                         shuffle=shuffle, seed=seed, columns=names, drop_last=drop_last, device=device,
                         dtypes=resolved)
    if len(loader) == 0:
        raise DatasetError(
            f"dataset {handle.name!r} has {handle.num_rows} rows: {loader.rows_per_rank} per rank over "
            f"{world_size} ranks, fewer than batch_size={batch_size}, so drop_last=True would yield no batch; "
            "lower batch_size or pass drop_last=False")
    return loader
