"""The rank side: this rank's equal share of a cached dataset, as batches of torch tensors. No Spark here, only
the Parquet files the driver's Petastorm converter wrote. Why not Petastorm's reader (``make_batch_reader`` /
``make_torch_dataloader``): it shards by row group, round robin, so 1,000 rows in 10 row groups over 3 ranks
gives 400/300/300 rows and DDP hangs on the rank with more batches; its worker pool returns row groups in no
fixed order, so an epoch cannot be reproduced; and it is much slower than a plain pyarrow read on array columns
(BENCHMARKS.md, Data loading). So this module reads the cache's files with pyarrow: whole columns at a time,
list values reshaped without a copy, no per-row Python.

The epoch order (:func:`shard_pieces`, :func:`block_runs`): the row groups of all files in a permuted order,
and inside each row group its blocks of 256 rows in a permuted order, both from ``(seed, epoch)`` only.
Rank ``r`` takes positions ``[r*n, (r+1)*n)`` of that order, so ranks never overlap and every rank gets
exactly ``n`` rows whatever the file layout. Inside a rank, rows are shuffled again one by one across a
window of about 16 MiB (two of the cache's row groups) while they are copied out of pyarrow's buffers: that
copy is the only one, and a batch is a view of it. Two more threads decode the next row groups meanwhile.

The columns whose rows differ in size (binary, string, sequence) are gathered by :mod:`.variable_size` into the
same places of the same windows, so every column of a batch holds the same rows; the window's size counts
their bytes (their average row in the cache, from the files' footers). The numbers' path does not change with
them. A loader's place in its epochs: :mod:`.loader_state` (dealt out to another number of ranks:
:mod:`.dealt_epoch`); a user's transform: :mod:`.transformed_loader`.
"""
import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..handle import NESTED, NUMBER_KINDS, SCALAR, DatasetError, DatasetHandle
from ..urls import open_parquet
from . import dealt_epoch, variable_size
from .arrays import list_values, nested_values, numpy_dtype, rows_view, to_numpy
from .column_options import ColumnOptions
from .epoch_order import batches_per_rank, block_runs, merged, rows_per_rank, shard_pieces
from .loader_state import Resumable, counted, windows_to_read
from .prefetch import prefetched

_WINDOW_BYTES = 16 << 20     # rows shuffled together inside a rank; with the cache's 8 MiB row groups this bounds a
#                              rank's peak memory growth whatever the dataset's size (bench/bench_scaling.py)
_READ_CHUNK_ROWS = 4096      # rows pyarrow decodes at a time
_DECODE_THREADS = True       # pyarrow decodes the columns of a chunk in parallel (faster: bench_data.py)
_PREFETCH_WINDOWS = 2        # windows gathered ahead of the consumer by the background thread
_DECODE_WORKERS = 2          # threads decoding row groups, each its own (see ShardLoader._windows)
_DECODE_AHEAD = 4            # row groups decoded ahead of the window being gathered


class ShardLoader(Resumable):
    """An iterable over this rank's batches of one epoch; see :func:`~.factory.make_loader`.

    ``len(loader)`` is the number of batches, the same on every rank. Iterating again replays the same
    epoch; :meth:`set_epoch` moves to another (``loader.sampler.set_epoch`` too, which is what Lightning
    calls). :meth:`state_dict` and :meth:`load_state_dict` save and restore the place in an epoch. Timing,
    summed over all iterations so far: ``wait_seconds`` (the consumer waited for data), ``read_seconds`` (the
    background thread read and shuffled), ``batches`` and ``rows`` yielded.
    """

    def __init__(self, handle: DatasetHandle, *, rank: int, world_size: int, batch_size: int, epoch: int,
                 shuffle: bool, seed: int, columns: Sequence[str], drop_last: bool, device, options: ColumnOptions):
        self.handle, self.rank, self.world_size, self.batch_size = handle, rank, world_size, batch_size
        self.epoch, self.shuffle, self.seed, self.drop_last = epoch, shuffle, seed, drop_last
        self.columns = [handle.column(c) for c in columns]
        self.device = device
        self._options = options
        # The fixed-size numbers take the numpy path; the others (binary, string, sequence) .variable_size.
        self._numbers = [c for c in self.columns if c.kind in NUMBER_KINDS]
        self._variable = [c for c in self.columns if c.kind not in NUMBER_KINDS]
        self._torch_dtypes = {c.name: options.dtypes[c.name] for c in self._numbers}
        self._np_dtypes = {c: numpy_dtype(t) for c, t in self._torch_dtypes.items()}
        self._groups = [(f, g) for f, rows in enumerate(handle.row_group_rows) for g in range(len(rows))]
        self._group_rows = [n for rows in handle.row_group_rows for n in rows]
        row_bytes = sum(np.dtype(c.dtype).itemsize * (c.length or 1) for c in self._numbers)
        row_bytes += variable_size.row_bytes(self._variable)
        self._window_rows = max(batch_size, _WINDOW_BYTES // max(row_bytes, 1))
        self.wait_seconds = self.read_seconds = 0.0
        self.batches = self.rows = 0
        self.on_progress = None  # called with (epoch, batches yielded, len(self)) after each batch
        self._resume_at, self._at = None, (epoch, 0)  # see Resumable

    def _peer(self, rank: int, world_size: int) -> "ShardLoader":
        """A loader of the same dataset, columns, options and epoch order as rank ``rank`` of ``world_size``."""
        return ShardLoader(self.handle, rank=rank, world_size=world_size, batch_size=self.batch_size,
                           epoch=self.epoch, shuffle=self.shuffle, seed=self.seed,
                           columns=[c.name for c in self.columns], drop_last=self.drop_last, device=self.device,
                           options=self._options)

    @property
    def rows_per_rank(self) -> int:
        return rows_per_rank(self.handle.num_rows, self.world_size, self.drop_last)

    def __len__(self) -> int:
        return batches_per_rank(self.handle.num_rows, self.world_size, self.batch_size, self.drop_last)

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
            for c in self._variable:
                chunks[c.name].append(rb.column(c.name))  # pyarrow's own array: gathered by pyarrow
            for c in self._numbers:
                arr = rb.column(c.name)
                if c.kind == SCALAR:
                    chunks[c.name].append(to_numpy(arr))
                    continue
                # The list's values as one flat buffer, reshaped: no per-row work and no copy.
                flat = list_values(arr) if c.kind != NESTED else nested_values(arr)
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

    def _gather(self, decoded: dict, runs, carry: Union[None, int, Dict[str, np.ndarray]], window: int):
        """Copy the runs' rows (after ``carry``) into one fresh array per column, shuffled as they land.

        The one copy a row gets: out of pyarrow's buffers, into its place in the window, cast on the way.
        ``carry``: the rows the window before carried over (``None``: none), or their number only, where that
        window was not read (:func:`.loader_state.windows_to_read`): a placeholder of as many rows (zeros, nulls)
        then stands for them. The window's own rows land where they would after the real ones (their places
        depend on that number only), and a window carries over its own rows only, so the placeholder's rows
        reach no batch but the window's own, which such a window does not yield.
        """
        kept = carry if isinstance(carry, int) else len(next(iter(carry.values()))) if carry else 0
        total = sum(end - first for _, first, end in runs)
        dest = (np.random.default_rng([self.seed, self.epoch, 2, self.rank, window]).permutation(total) + kept
                if self.shuffle else None)
        out = {c.name: np.empty((kept + total,) + ((c.length,) if c.length else ()),
                                dtype=self._np_dtypes[c.name] or c.dtype) for c in self._numbers}
        if kept:
            for name, arr in out.items():
                arr[:kept] = 0 if isinstance(carry, int) else carry[name]
        if dest is not None:
            # The window's order is random anyway: place its rows by chunk of pyarrow's output, one copy call
            # per chunk and column instead of one per block (the Python loop was the cost, not the copy).
            runs = merged(runs)
        # Where a column keeps its dtype, each row is moved as one opaque value (a numpy void of the row's
        # bytes) by np.put: less CPU than numpy's fancy assignment of 2-D rows, which walks every element (see
        # BENCHMARKS.md, Data loading).
        as_rows = {c.name: rows_view(out[c.name]) for c in self._numbers
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
        if self._variable:  # the same runs, each row to the same place: every column of a batch has the same rows
            order = variable_size.window_order(dest, kept)
            out.update({c.name: variable_size.gather_column(c.name, decoded, runs, order, _carried(carry, c.name,
                                                                                                  decoded, runs))
                        for c in self._variable})
            out = {c.name: out[c.name] for c in self.columns}
        return out

    def _windows(self, skip: int, stop: int) -> Iterator[List[Dict]]:
        """Lists of batches (dicts of CPU tensors), one list per shuffle window, batches ``[skip, stop)`` of the
        epoch. Of the windows before them, only the one the first of them takes rows over from is gathered
        (after a placeholder of the rows it took over itself), and none after them:
        .loader_state.windows_to_read.

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
        todo = windows_to_read([sum(end - first for _, first, end in runs) for runs in plan], self.batch_size,
                               self.drop_last, skip, stop)
        left = stop - skip  # batches still to make: none past `stop`
        need_order, last_use = [], {}
        for index, _, _ in todo:
            for group, _, _ in plan[index]:
                if group not in last_use:
                    need_order.append(group)
                last_use[group] = index
        decoder = ThreadPoolExecutor(_DECODE_WORKERS,
                                     thread_name_prefix=f"spark_dist-decode-{self.handle.name}-rank{self.rank}")
        pending: Dict[int, "Future"] = {}
        submitted = 0
        bs = self.batch_size
        carry = todo[0][2] if todo else None  # the first window read: a placeholder of the rows it carries in
        try:
            for index, skipped, _ in todo:
                runs, t0 = plan[index], time.perf_counter()
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
                starts = range(skipped * bs, cut, bs)[:left]
                left -= len(starts)
                batches = [self._to_torch(rows, s, min(s + bs, cut), pin) for s in starts]
                carry = None if cut == n else {c: a[cut:] for c, a in rows.items()}
                self.read_seconds += time.perf_counter() - t0
                yield batches
        finally:
            decoder.shutdown(wait=True, cancel_futures=True)

    def _to_torch(self, rows, start: int, stop: int, pin: bool) -> Dict:
        import torch

        batch, shapes = {}, self._options.shapes
        for c, a in rows.items():
            if c not in self._np_dtypes:  # a variable-size column
                batch.update(variable_size.batch_values(self.handle.column(c), a, start, stop, self._options, pin))
                continue
            t = torch.from_numpy(a[start:stop])  # a view of the window: no copy
            if c in shapes:
                t = t.view(-1, *shapes[c])
            if self._np_dtypes[c] is None:
                t = t.to(self._torch_dtypes[c])
            batch[c] = t.pin_memory() if pin else t
        return batch

    # -- the consumer's side ------------------------------------------------------------------------------
    def _stream(self, skip: int = 0, stop: Optional[int] = None) -> Iterator[Dict]:
        """Batches ``[skip, stop)`` (default: to the end) of this loader's epoch, on its device, read ahead by a
        background thread; not counted into the loader's place (the caller's iteration counts what it yields)."""
        stop = len(self) if stop is None else stop
        yielded = 0
        windows = prefetched(lambda: self._windows(skip, stop), depth=_PREFETCH_WINDOWS, waited=self._waited,
                             name=f"spark_dist-loader-{self.handle.name}-rank{self.rank}")
        with contextlib.closing(windows):  # closed with this iteration: its thread is joined then
            for window in windows:
                for batch in window:
                    yielded += 1
                    yield batch if self.device is None else self._on_device(batch)
        if yielded != stop - skip:  # would hang DDP on the other ranks: fail loudly instead
            raise RuntimeError(f"dataset {self.handle.name!r}: rank {self.rank} yielded {yielded} batches, "
                               f"expected {stop - skip}; the cache files changed since prepare_datasets?")

    def _on_device(self, batch: Dict) -> Dict:
        if self._variable:
            return variable_size.to_device(batch, self.device)
        return {c: t.to(self.device, non_blocking=True) for c, t in batch.items()}

    def _waited(self, seconds: float) -> None:
        self.wait_seconds += seconds

    def _placed(self, place: Union[int, Tuple[int, int]]) -> Iterator[Tuple[Tuple[int, int], Dict]]:
        """``((rank, index), batch)`` for the rest of this loader's epoch from ``place``: a batch, or ``(origin
        world size, position)`` of an epoch dealt out (.dealt_epoch). ``(rank, index)`` is where the batch
        belongs in the epoch it was made for: this rank's, or an old rank's when dealt out."""
        if isinstance(place, tuple):
            yield from dealt_epoch.dealt_batches(self, self.epoch, *place)
            return
        with contextlib.closing(self._stream(place)) as batches:
            for index, batch in enumerate(batches, start=place):
                yield (self.rank, index), batch

    def __iter__(self) -> Iterator[Dict]:
        # A generator: nothing below runs before the first batch is asked for, so a set_epoch between iter() and
        # the first next() (Lightning's order) still picks this iteration's epoch.
        epoch = self.epoch
        place, start, total = self._begin(epoch)
        with contextlib.closing(self._placed(place)) as placed:
            yield from counted(self, epoch, (batch for _, batch in placed), start, total)


def _carried(carry: Union[None, int, Dict], name: str, decoded: dict, runs):
    """A variable-size column's part of ``carry`` (see ``ShardLoader._gather``): its rows, ``None``, or for a
    placeholder of ``carry`` rows as many nulls of the column's type."""
    if not isinstance(carry, int):
        return carry and carry[name]
    if not carry:
        return None
    import pyarrow as pa

    return pa.nulls(carry, decoded[runs[0][0]][1][name][0].type)
