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
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Tuple

from .epoch_order import batches_per_rank


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


def reads(where: List[Tuple[int, int]]) -> List[Tuple[int, int, int]]:
    """``where`` (:func:`origins`) as ``(old rank, first batch, batches)``: runs of consecutive batches of one
    old rank, each read by one reader opened at its first batch."""
    runs: List[Tuple[int, int, int]] = []
    for r, b in where:
        if runs and runs[-1][0] == r and runs[-1][1] + runs[-1][2] == b:
            runs[-1] = (r, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((r, b, 1))
    return runs


def dealt_batches(loader, epoch: int, origin_world: int, position: int
                  ) -> Iterator[Tuple[Tuple[int, int], Dict]]:
    """This rank's batches of the rest of ``epoch``, which ``origin_world`` ranks had taken ``position`` units
    of: ``((old rank, batch), batch)`` pairs, each batch as old rank ``q % n``'s loader yields batch ``q // n``.
    ``loader`` is the rank's ``ShardLoader``; its ``_peer(rank, world_size)`` is a loader of another rank.

    Invariant: one reader is open at a time, opened at the batch it is for and closed, with its threads,
    before the next one opens; it makes exactly the batches of its run (:func:`reads`), and gathers no window
    past the run's last batch nor before the windows its first batch takes rows from
    (.loader_state.windows_to_read). The readers' waiting and reading times add up in ``loader``.
    """
    for r, first, count in reads(places(loader, origin_world, position)):
        reader = loader._peer(r, origin_world)
        reader.epoch = epoch
        try:
            with contextlib.closing(reader._stream(first, first + count)) as batches:
                for b, batch in enumerate(batches, start=first):
                    yield (r, b), batch
        finally:
            loader.wait_seconds += reader.wait_seconds
            loader.read_seconds += reader.read_seconds


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
