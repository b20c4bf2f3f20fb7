"""The epoch order of a cached dataset, a pure function of ``(seed, epoch)`` and the row groups' sizes.

The row groups of all files in a permuted order, and inside each row group its blocks of :data:`BLOCK_ROWS` rows
in a permuted order. Rank ``r`` takes positions ``[r*n, (r+1)*n)`` of that order (:func:`shard_pieces`), so
ranks never overlap and every rank gets exactly ``n`` rows whatever the file layout; every rank computes the
same order, so a row group split between two ranks is split without overlap (:func:`block_runs`). A rank's
rows are then shuffled window by window and cut into batches (:func:`window_batches`).
"""
from typing import List, Sequence, Tuple

import numpy as np

BLOCK_ROWS = 256  # unit of the order inside a row group: runs of rows copy at memcpy speed


def rows_per_rank(num_rows: int, world_size: int, drop_last: bool) -> int:
    """The rows each of ``world_size`` ranks takes in an epoch: ``num_rows // world_size`` with ``drop_last``,
    else rounded up (the last ranks wrap around to the start of the epoch order)."""
    return num_rows // world_size if drop_last else -(-num_rows // world_size)


def batches_per_rank(num_rows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The batches each of ``world_size`` ranks yields in an epoch (the last one partial without ``drop_last``)."""
    rows = rows_per_rank(num_rows, world_size, drop_last)
    return rows // batch_size if drop_last else -(-rows // batch_size)


def shard_pieces(row_group_rows: Sequence[int], *, world_size: int, rank: int, epoch: int, seed: int,
                 shuffle: bool, drop_last: bool) -> Tuple[List[Tuple[int, int, int]], int]:
    """This rank's rows in one epoch, as ``(row_group, start, stop)`` positions in each row group's epoch order.

    ``row_group_rows`` are the row counts of all row groups of the dataset (files in order). Each rank gets
    ``N // world_size`` rows with ``drop_last`` (the ``N % world_size`` rows at the end of the epoch order
    are left out; they differ per epoch), else ``ceil(N / world_size)``: the order wraps around, so the last
    ranks repeat up to ``world_size - 1`` rows from the start of the epoch. Returns ``(pieces, rows)``.
    """
    sizes = np.asarray(row_group_rows, dtype=np.int64)
    total = int(sizes.sum())
    per_rank = rows_per_rank(total, world_size, drop_last)
    if total == 0 or per_rank == 0:
        return [], 0
    order = (np.random.default_rng([seed, epoch, 0]).permutation(len(sizes)) if shuffle
             else np.arange(len(sizes)))
    ends = np.cumsum(sizes[order])
    pieces, pos, left = [], rank * per_rank, per_rank
    while left:  # more than one turn only when drop_last=False wraps around the end of the epoch order
        seg_start = pos % total
        seg_stop = min(seg_start + left, total)
        at, i = seg_start, int(np.searchsorted(ends, seg_start, side="right"))
        while at < seg_stop:
            first = int(ends[i] - sizes[order[i]])
            end = min(seg_stop, int(ends[i]))
            if end > at:
                pieces.append((int(order[i]), at - first, end - first))
            at = end
            i += 1
        left -= seg_stop - seg_start
        pos += seg_stop - seg_start
    return pieces, per_rank


def block_runs(seed: int, epoch: int, row_group: int, rows: int, start: int, stop: int,
               shuffle: bool) -> List[Tuple[int, int]]:
    """Positions ``[start, stop)`` of one row group's epoch order as ``(first, end)`` runs of its file order.

    The epoch order of a row group is its blocks of ``BLOCK_ROWS`` rows, permuted from
    ``(seed, epoch, row_group)``; every rank computes the same, so a row group split between two ranks
    is split without overlap. Without ``shuffle`` it is the file order.
    """
    if not shuffle:
        return [(start, stop)]
    blocks = -(-rows // BLOCK_ROWS)
    order = np.random.default_rng([seed, epoch, 1, row_group]).permutation(blocks)
    lengths = np.full(blocks, BLOCK_ROWS, dtype=np.int64)
    lengths[-1] = rows - (blocks - 1) * BLOCK_ROWS
    ends = np.cumsum(lengths[order])
    runs, at, i = [], start, int(np.searchsorted(ends, start, side="right"))
    while at < stop:
        block, end = int(order[i]), min(stop, int(ends[i]))
        first = block * BLOCK_ROWS + at - int(ends[i] - lengths[block])
        runs.append((first, first + end - at))
        at, i = end, i + 1
    return runs


def window_batches(window_rows: Sequence[int], batch_size: int, drop_last: bool) -> List[Tuple[int, int, int]]:
    """``(rows carried in, cut, batches)`` of each shuffle window of a rank's epoch, ``window_rows`` the rows each
    takes from the files, in order: a window is the rows the previous one carried over (its first ``carried
    in`` rows), then its own rows shuffled; it yields the batches of its rows ``[0, cut)`` (every full batch, the
    last window also its partial one unless ``drop_last``) and carries ``[cut, ...)`` over to the next.

    Where every window but the last holds at least ``batch_size`` rows (a loader's do), ``cut >= batch_size >``
    the rows a window carried in: what it carries over are its own rows.
    """
    out, carried, last = [], 0, len(window_rows) - 1
    for index, rows in enumerate(window_rows):
        n = carried + rows
        cut = n if index == last and not drop_last else n // batch_size * batch_size
        out.append((carried, cut, -(-cut // batch_size)))
        carried = n - cut
    return out


def merged(runs: List[Tuple[int, int, int]]) -> List[Tuple[int, int, int]]:
    """The same rows as ``runs``, in file order, adjacent runs joined."""
    out: List[Tuple[int, int, int]] = []
    for group, first, end in sorted(runs):
        if out and out[-1][0] == group and out[-1][2] == first:
            out[-1] = (group, out[-1][1], end)
        else:
            out.append((group, first, end))
    return out
