"""The rest of an epoch dealt out to another number of ranks: an elastic run that changed size inside an epoch.

An epoch of ``n`` ranks is ``n * L`` batches, the *units*, numbered in step order: unit ``q`` is batch
``q // n`` of old rank ``q % n``. After ``k`` steps the ranks have taken exactly units ``[0, k * n)``, so a
place in an epoch is one number, the *position* ``p`` (units taken), whatever world size took them. ``m`` new
ranks take the units from ``p`` on in the same order: new rank ``j`` takes units ``p + j``, ``p + j + m``, ...,
so after ``t`` steps the position is ``p + t * m`` again, and a later resize deals from there. Each unit is the
very batch old rank ``q % n`` would have yielded (its rows and its shuffle), so every row of the epoch is taken
once, except that every rank must take the same number of steps: where ``m`` does not divide the units left,
``drop_last=True`` leaves the last few out and ``drop_last=False`` repeats a few from the start of what was
left, as a loader deals out the rows that do not divide among its ranks. A unit keeps its transform's seed
too (:func:`origins`): it draws what it drew on the old rank.

Reading them (:func:`dealt_batches`): every old rank has the same windows (as many rows in each, so the same
batches: :func:`.epoch_order.window_batches`), so the units whose batches one window index yields are
consecutive. A rank makes its batches a *part* at a time (:func:`parts`): its batches of one window index. Each
row of a part is found where its old rank's window shuffle put it, or, for the rows a window took over from the
one before, where that one put them (:func:`_part_sources`); only the row groups holding those rows are
decoded, and only those rows are copied, each once, straight into the part's batches (:func:`gather_rows`). No
window is gathered whole: a new rank takes about ``1 / m`` of every old rank's window. Those rows are spread
over all of the window's row groups, though, so each new rank decodes every row group left, some twice (one
that two windows share, or whose rows a window carried out, is decoded for each of their parts).
"""
from __future__ import annotations

import bisect
import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from .epoch_order import batches_per_rank, merged, window_batches
from .prefetch import prefetched

_HOLD_WINDOWS = 2   # a part holds at most this many windows' rows: where n <= 2 * m that is all of a window index,
#                     so an old window's row groups are decoded for its part (and the next one's where that takes
#                     rows the window carried out, or rows of a row group the two windows share)
_DECODE_WORKERS = 2  # threads decoding row groups, as a loader's
_DECODE_AHEAD = 4    # row groups decoded ahead of the ones the old rank's window being gathered takes rows from


def steps(units: int, position: int, world_size: int, drop_last: bool) -> int:
    """The steps every one of ``world_size`` ranks takes to deal units ``[position, units)``."""
    left = max(units - position, 0)
    return left // world_size if drop_last else -(-left // world_size)


def my_units(units: int, position: int, world_size: int, rank: int, drop_last: bool) -> List[int]:
    """The units ``rank`` of ``world_size`` takes, in its step order (wrapping to the start of what was left
    where ``drop_last=False`` has to fill the last step)."""
    left = units - position
    return [position + (rank + i * world_size) % left
            for i in range(steps(units, position, world_size, drop_last))]


def origins(units: int, position: int, origin_world: int, world_size: int, rank: int, drop_last: bool
            ) -> List[Tuple[int, int]]:
    """``(old rank, batch of its epoch)`` of each unit ``rank`` of ``world_size`` takes (:func:`my_units`), in
    step order: where each of its batches belongs in the epoch of ``origin_world`` ranks."""
    return [(q % origin_world, q // origin_world)
            for q in my_units(units, position, world_size, rank, drop_last)]


def places(loader, origin_world: int, position: int) -> List[Tuple[int, int]]:
    """:func:`origins` of ``loader``'s batches (a loader of this rank) in the rest of an epoch of
    ``origin_world`` ranks from ``position``."""
    units = epoch_units(loader.handle.num_rows, origin_world, loader.batch_size, loader.drop_last)
    return origins(units, position, origin_world, loader.world_size, loader.rank, loader.drop_last)


def parts(where: List[Tuple[int, int]], first_batches: Sequence[int], hold: int) -> List[List[Tuple[int, int]]]:
    """``where`` (:func:`origins`) cut into parts, each made at once: runs of units whose batches one window index
    yields (``first_batches``: each window's first batch), at most ``hold`` of them."""
    out: List[List[Tuple[int, int]]] = []
    current = -1
    for r, b in where:
        w = bisect.bisect_right(first_batches, b) - 1
        if out and w == current and len(out[-1]) < hold:
            out[-1].append((r, b))
        else:
            out.append([(r, b)])
            current = w
    return out


def dealt_batches(loader, epoch: int, origin_world: int, position: int
                  ) -> Iterator[Tuple[Tuple[int, int], Dict]]:
    """This rank's batches of the rest of ``epoch``, which ``origin_world`` ranks had taken ``position`` units
    of: ``((old rank, batch), batch)`` pairs, each batch as old rank ``q % n``'s loader yields batch ``q // n``.
    ``loader`` is the rank's ``ShardLoader``; its ``_peer(rank, world_size)`` is a loader of another rank, whose
    windows' runs tell where that rank's rows are.

    Invariants: every row copied is a row yielded, and every row group decoded holds one (decoded once for each
    part that takes rows from it); one reader: a thread making the parts (at most one made and not yet taken)
    and ``_DECODE_WORKERS`` threads decoding, all ended when the iteration ends; held at once: three parts (at
    most ``_HOLD_WINDOWS`` windows' rows each), the row groups of the old window being gathered and up to
    ``_DECODE_AHEAD`` more. The waiting and reading times add up in ``loader``.
    """
    where = places(loader, origin_world, position)
    made = prefetched(lambda: _parts_made(loader, epoch, origin_world, where), depth=1, waited=loader._waited,
                      name=f"spark_dist-loader-{loader.handle.name}-rank{loader.rank}")
    with contextlib.closing(made):
        for part in made:
            for place, batch in part:
                yield place, batch if loader.device is None else loader._on_device(batch)


def _parts_made(loader, epoch: int, origin_world: int, where: List[Tuple[int, int]]
                ) -> Iterator[List[Tuple[Tuple[int, int], Dict]]]:
    """The batches of ``where``, a list a part (:func:`parts`), made in the reader's thread."""
    if not where:
        return
    import torch

    pin = loader.device is not None and torch.device(loader.device).type == "cuda"
    old = _OldRanks(loader, epoch, origin_world, where[0][0])
    hold = max(1, _HOLD_WINDOWS * loader._window_rows // loader.batch_size)
    variable = {c.name for c in loader._variable}
    decoder = ThreadPoolExecutor(_DECODE_WORKERS,
                                 thread_name_prefix=f"spark_dist-decode-{loader.handle.name}-rank{loader.rank}")
    try:
        for part in parts(where, old.first, hold):
            t0 = time.perf_counter()
            rows, spans, found = _part_sources(old, part)
            out = {c.name: [] if c.name in variable else
                   np.empty((rows,) + ((c.length,) if c.length else ()),
                            dtype=loader._np_dtypes[c.name] or c.dtype) for c in loader.columns}
            _gathered(loader, decoder, out, found)
            for name in variable:
                out[name] = _joined(out[name])
            batches = [(place, loader._to_torch(out, start, stop, pin)) for place, (start, stop) in zip(part, spans)]
            loader.read_seconds += time.perf_counter() - t0
            yield batches
    finally:
        decoder.shutdown(wait=True, cancel_futures=True)


class _OldRanks:
    """The old ranks' windows, as a dealt epoch asks for them: their layout (the same for every old rank) and,
    for each old rank, the runs of a window (its latest two kept: a window and the one before it, whose rows it
    carried in; an earlier one is made again) and where the window's shuffle put each of its own rows."""

    def __init__(self, loader, epoch: int, origin_world: int, some_rank: int):
        self.loader, self.epoch, self.origin_world = loader, epoch, origin_world
        self._ranks: Dict[int, list] = {}  # old rank -> [peer, its windows' runs, next window, {window: runs}]
        sizes = [sum(end - first for _, first, end in runs) for runs in self._peer(some_rank)._window_runs()]
        self.layout = window_batches(sizes, loader.batch_size, loader.drop_last)
        self.first = np.cumsum([0] + [count for _, _, count in self.layout])[:-1].tolist()

    def _peer(self, r: int):
        if r not in self._ranks:
            peer = self.loader._peer(r, self.origin_world)
            peer.epoch = self.epoch
            self._ranks[r] = [peer, peer._window_runs(), 0, {}]
        return self._ranks[r][0]

    def runs(self, r: int, w: int) -> List[Tuple[int, int, int]]:
        peer = self._peer(r)
        state = self._ranks[r]
        if w not in state[3] and w < state[2]:
            state[1:] = [peer._window_runs(), 0, {}]
        while state[2] <= w:
            state[3][state[2]] = next(state[1])
            state[3].pop(state[2] - 2, None)
            state[2] += 1
        return state[3][w]

    def located(self, r: int, w: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(row groups, rows)`` of the rows at ``positions`` among the own rows of old rank ``r``'s window ``w``
        (after those it carried in), where ``ShardLoader._gather`` puts them: the rows of its runs in order
        (their file order where shuffled) go to places ``permutation[i]`` of the window's shuffle."""
        runs = self.runs(r, w)
        index = positions
        if self.loader.shuffle:
            total = sum(end - first for _, first, end in runs)
            shuffle = np.random.default_rng([self.loader.seed, self.epoch, 2, r, w]).permutation(total)
            inverse = np.empty_like(shuffle)
            inverse[shuffle] = np.arange(total)
            index, runs = inverse[positions], merged(runs)
        table = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
        ends = np.cumsum(table[:, 2] - table[:, 1])
        run = np.searchsorted(ends, index, side="right")
        return table[run, 0], table[run, 2] - (ends[run] - index)


def _part_sources(old: _OldRanks, part: List[Tuple[int, int]]):
    """``(rows, spans, found)`` of a part: its rows, each batch's ``(start, stop)`` among them, and where they are:
    ``(slots, row groups, rows)`` arrays of each old rank's window they come from, in the order of the old ranks
    and windows. A batch's rows before the ones its window carried in are the rows the window before it carried
    out: places ``cut + x`` of that one (its own rows: see :func:`.epoch_order.window_batches`)."""
    bs = old.loader.batch_size
    wanted: Dict[Tuple[int, int], List[Tuple[np.ndarray, np.ndarray]]] = {}
    spans, at = [], 0
    for r, b in part:
        w = bisect.bisect_right(old.first, b) - 1
        start = (b - old.first[w]) * bs
        stop = min(start + bs, old.layout[w][1])
        x, slots = np.arange(start, stop), np.arange(at, at + stop - start)
        spans.append((at, at + stop - start))
        at += stop - start
        while len(x):
            kept = old.layout[w][0]
            own = x >= kept
            wanted.setdefault((r, w), []).append((slots[own], x[own] - kept))
            x, slots, w = x[~own] + old.layout[w - 1][1], slots[~own], w - 1  # none left where w == 0
    found = []
    for r, w in sorted(wanted):
        slots = np.concatenate([s for s, _ in wanted[r, w]])
        found.append((slots, *old.located(r, w, np.concatenate([p for _, p in wanted[r, w]]))))
    return at, spans, found


def _gathered(loader, decoder: ThreadPoolExecutor, out: Dict, found) -> None:
    """:func:`gather_rows` of each of ``found``'s windows in turn, their row groups decoded by ``decoder`` in
    that order, up to ``_DECODE_AHEAD`` ahead of the window gathered; each dropped after its last window."""
    needs = [np.unique(groups).tolist() for _, groups, _ in found]
    order = list(dict.fromkeys(g for groups in needs for g in groups))
    last_use = {g: i for i, groups in enumerate(needs) for g in groups}
    pending: Dict[int, Future] = {}
    submitted = 0
    for i, groups in enumerate(needs):
        while submitted < len(order) and (order[submitted] in groups or
                                          sum(1 for g in pending if g not in groups) < _DECODE_AHEAD):
            pending[order[submitted]] = decoder.submit(_decoded, loader, order[submitted])
            submitted += 1
        gather_rows(loader, out, found[i], {g: pending[g].result() for g in groups})
        for g in groups:
            if last_use[g] == i:
                del pending[g]


def _decoded(loader, group: int):
    """``loader._decode(group)``, checked to hold the rows the handle says (the plan's rows are found in it)."""
    starts, chunks = loader._decode(group)
    if int(starts[-1]) != loader._group_rows[group]:
        raise RuntimeError(f"dataset {loader.handle.name!r}: row group {group} holds {int(starts[-1])} rows, not "
                           f"{loader._group_rows[group]}; the cache files changed since prepare_datasets?")
    return starts, chunks


def gather_rows(loader, out: Dict, found: Tuple[np.ndarray, np.ndarray, np.ndarray], decoded: Dict) -> None:
    """Copy the rows ``found`` ``(slots, row groups, rows)`` says into ``out``'s ``slots``, each row once, out of
    ``decoded`` (``{row group: ShardLoader._decode's}``): into a number column's array, cast as a window's
    gather casts it; a variable-size column's as ``(slots, pyarrow array)`` pieces (:func:`_joined`)."""
    import pyarrow as pa

    variable = {c.name for c in loader._variable}
    slots, groups, rows = found
    order = np.lexsort((rows, groups))  # by row group, then row: each chunk's rows together
    slots, groups, rows = slots[order], groups[order], rows[order]
    bounds = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist(), len(groups)]
    for lo, hi in zip(bounds, bounds[1:]):
        starts, chunks = decoded[int(groups[lo])]
        cuts = np.searchsorted(rows[lo:hi], starts) + lo
        for k in np.flatnonzero(np.diff(cuts)).tolist():
            where, at = slots[cuts[k]:cuts[k + 1]], rows[cuts[k]:cuts[k + 1]] - starts[k]
            for c in loader.columns:
                if c.name in variable:
                    out[c.name].append((where, chunks[c.name][k].take(pa.array(at))))
                else:
                    out[c.name][where] = chunks[c.name][k][at]


def _joined(pieces: List[Tuple[np.ndarray, object]]):
    """A variable-size column's ``(slots, pyarrow array)`` pieces as one pyarrow array, each row at its slot."""
    import pyarrow as pa

    slots = np.concatenate([s for s, _ in pieces])
    rows = pa.concat_arrays([a for _, a in pieces]) if len(pieces) > 1 else pieces[0][1]
    return rows.take(pa.array(np.argsort(slots)))


def steps_left(loader, origin_world: int, position: int) -> int:
    """The steps ``loader``'s ranks take to deal out the rest of an epoch of ``origin_world`` ranks from
    ``position``."""
    units = epoch_units(loader.handle.num_rows, origin_world, loader.batch_size, loader.drop_last)
    return steps(units, position, loader.world_size, loader.drop_last)


def epoch_units(num_rows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The units (batches in step order) of an epoch of ``world_size`` ranks."""
    return world_size * batches_per_rank(num_rows, world_size, batch_size, drop_last)


def place(state: Dict) -> Tuple[int, int]:
    """``(origin world size, position)`` of a loader's ``state`` (``state_dict()``): the world size whose units
    its epoch is counted in, and the units taken (a state of a whole-world epoch: its batches times its ranks)."""
    origin = state.get("origin")
    if origin:
        return int(origin["world_size"]), int(origin["position"])
    world = int(state["world_size"])
    return world, int(state["batches"]) * world


def deals_evenly(state: Dict, world_size: int) -> bool:
    """Whether the rest of the epoch that a loader's ``state`` (``state_dict()``) is in divides evenly among
    ``world_size`` ranks: resuming there on that many ranks leaves no batch out and repeats none. An elastic
    run grows back at such a checkpoint."""
    n, position = place(state)
    units = epoch_units(int(state["num_rows"]), n, int(state["batch_size"]), bool(state["drop_last"]))
    return (units - position) % world_size == 0


def loader_states(obj) -> List[Dict]:
    """The loader states among a checkpoint's top-level values: a spark_dist loader, or what its
    ``state_dict()`` returned."""
    if not isinstance(obj, dict):
        return []
    found = []
    for value in obj.values():
        if hasattr(value, "handle") and hasattr(value, "state_dict"):
            value = value.state_dict()
        if isinstance(value, dict) and {"epoch", "batches", "world_size", "num_rows", "batch_size"} <= set(value):
            found.append(value)
    return found
