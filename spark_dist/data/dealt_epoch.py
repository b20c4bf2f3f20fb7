"""The rest of an epoch dealt out to another number of ranks: an elastic run that changed size inside an epoch.

An epoch of ``n`` ranks is ``n * L`` batches, the *units*, numbered in step order: unit ``q`` is batch
``q // n`` of old rank ``q % n``. After ``k`` steps the ranks have taken exactly units ``[0, k * n)``, so a
place in an epoch is one number, the *position* ``p`` (units taken), whatever world size took them. ``m`` new
ranks take the units from ``p`` on in the same order: new rank ``j`` takes units ``p + j``, ``p + j + m``, ...,
so after ``t`` steps the position is ``p + t * m`` again, and a later resize deals from there. Each unit is the
very batch old rank ``q % n`` would have yielded (its rows and its shuffle), so every row of the epoch is taken
once, except that every rank must take the same number of steps: where ``m`` does not divide the units left,
``drop_last=True`` leaves the last few out and ``drop_last=False`` repeats a few from the start of what was
left, as a loader deals out the rows that do not divide among its ranks.
"""
from __future__ import annotations

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


def dealt_batches(loader, epoch: int, origin_world: int, position: int, units: int) -> Iterator[Tuple[Dict, int]]:
    """This rank's batches of the rest of ``epoch``, which ``origin_world`` ranks had taken ``position`` units
    of ``units``: ``(batch, step)`` pairs, each batch as old rank ``q % n``'s loader yields batch ``q // n``. ``loader``
    is the rank's ``ShardLoader``; one loader per old rank whose batches this rank takes reads them, each
    from its first such batch on, skipping the others' batches between (a resize is rare: reading a few
    batches twice is its price)."""
    from .loader import ShardLoader

    def old_rank(r: int, first: int):
        old = ShardLoader(loader.handle, rank=r, world_size=origin_world, batch_size=loader.batch_size,
                          epoch=epoch, shuffle=loader.shuffle, seed=loader.seed,
                          columns=[c.name for c in loader.columns], drop_last=loader.drop_last,
                          device=loader.device, options=loader._options)
        old._resume_at = (epoch, first)
        return iter(old), first

    readers: Dict[int, Tuple[Iterator, int]] = {}
    try:
        for step, q in enumerate(my_units(units, position, loader.world_size, loader.rank, loader.drop_last)):
            b, r = divmod(q, origin_world)
            if r not in readers or readers[r][1] > b:  # a first batch of this old rank, or a wrap back
                readers[r] = old_rank(r, b)
            it, at = readers[r]
            while at < b:  # another new rank's batch: read past it
                next(it)
                at += 1
            batch = next(it)
            readers[r] = (it, at + 1)
            yield batch, step
    finally:
        for it, _ in readers.values():
            it.close()


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


def iterate(loader, epoch: int, origin_world: int, position: int) -> Iterator[Dict]:
    """``loader``'s iteration of a dealt epoch: its batches, with the loader's place (``_at``, ``_dealt``), counts
    and progress kept as its own iteration keeps them, so that ``state_dict`` names the position reached."""
    loader._dealt = (epoch, origin_world, position)
    units = epoch_units(loader.handle.num_rows, origin_world, loader.batch_size, loader.drop_last)
    total = steps(units, position, loader.world_size, loader.drop_last)
    loader._at = (epoch, 0)
    for batch, step in dealt_batches(loader, epoch, origin_world, position, units):
        loader.batches += 1
        loader.rows += len(next(iter(batch.values())))
        loader._at = (epoch, step + 1)
        if loader.on_progress is not None:
            loader.on_progress(epoch, step + 1, total)
        yield batch


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
