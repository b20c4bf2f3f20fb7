"""A loader's place in its epochs, for checkpoints and for training frameworks.

- :func:`state_of` / :func:`checked_state`: what ``ShardLoader.state_dict`` saves (the epoch, the batches already
  yielded in it, and what the epoch order depends on) and what ``load_state_dict`` accepts back, on any number
  of ranks (:mod:`.dealt_epoch`).
- :func:`windows_to_read`: which shuffle windows an iteration resuming at batch ``k`` must still gather. Every
  batch after the resume point is the batch an uninterrupted epoch gives: the windows, the rows they carry
  over and their shuffles are the same. Of the windows before the one of batch ``k``, only the one it takes rows
  over from is read: a loader's windows carry over rows of their own only, never those they took over themselves.
- :func:`counted`: the one place a loader counts the batches it yields (its place, its totals, its progress).
- :class:`EpochSampler`: the ``loader.sampler`` that Lightning's fit loop calls ``set_epoch`` on at each epoch's
  start (``lightning.fabric.utilities.data._set_sampler_epoch`` looks for ``sampler`` and
  ``batch_sampler.sampler``, never at the loader itself).
"""
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from ..handle import DatasetError
from . import dealt_epoch
from .epoch_order import window_batches

# What the epoch order and the batches depend on besides (seed, shuffle), which a state carries and restores:
# a position (batches yielded) means the same rows only where these are the same.
_SAME = ("num_rows", "world_size", "batch_size", "drop_last")


def state_of(loader, epoch: int, batches) -> Dict:
    """The state of ``loader`` (a ``ShardLoader``) at batch ``batches`` of ``epoch``; inside an epoch dealt out
    after a resize (:mod:`.dealt_epoch`), or at such a place restored (``batches`` an ``(origin world size,
    position)`` pair), also its ``origin``: the world size whose units the epoch is counted in and the position
    reached."""
    state = {"dataset": loader.handle.name, "epoch": int(epoch), "batches": batches, "seed": loader.seed,
             "shuffle": loader.shuffle, "num_rows": loader.handle.num_rows, "world_size": loader.world_size,
             "batch_size": loader.batch_size, "drop_last": loader.drop_last, "epoch_batches": len(loader)}
    dealt = getattr(loader, "_dealt", None)
    if isinstance(batches, tuple):
        origin, position, state["batches"] = batches[0], batches[1], 0
    elif dealt is not None and dealt[0] == epoch:
        origin, position = dealt[1], dealt[2] + loader.world_size * int(batches)
    else:
        return state
    units = dealt_epoch.epoch_units(loader.handle.num_rows, origin, loader.batch_size, loader.drop_last)
    start = position - loader.world_size * state["batches"]
    state.update(origin={"world_size": origin, "position": position},
                 epoch_batches=dealt_epoch.steps(units, start, loader.world_size, loader.drop_last))
    return state


def checked_state(loader, state: Dict) -> Tuple[int, Union[int, Tuple[int, int]], int, bool]:
    """``(epoch, place, seed, shuffle)`` of a state :func:`state_of` made, once it fits ``loader``; ``place`` is
    the batches already yielded, or ``(origin world size, position)`` where the rest of the epoch is to be
    dealt out to this loader's ranks (:mod:`.dealt_epoch`). A state saved by another rank fits: every rank is
    at the same place. A state saved by a loader with another number of ranks fits anywhere (an elastic run
    that changed size deals the rest of the epoch out); with another batch size or ``drop_last``, at an
    epoch's start or end only (a place inside an epoch names batches of that size).

    Raises:
        DatasetError: the state is not a loader's, or was saved by a loader with another number of rows, or
            with another batch size or ``drop_last`` inside an epoch, or is past the epoch's end.
    """
    where = f"dataset {loader.handle.name!r}"
    if not isinstance(state, dict) or not {"epoch", "batches"} <= set(state):
        raise DatasetError(f"{where}: load_state_dict needs what state_dict() returned, got {state!r}",
                           loader.handle.name)
    ours = state_of(loader, 0, 0)
    differ = [f"{k}={state[k]!r} (this loader: {ours[k]!r})" for k in _SAME if k in state and state[k] != ours[k]]
    epoch, batches = int(state["epoch"]), int(state["batches"])
    seed, shuffle = state.get("seed", loader.seed), state.get("shuffle", loader.shuffle)
    at_end = "epoch_batches" in state and batches == int(state["epoch_batches"])
    if differ and not any(d.startswith("num_rows=") for d in differ) and (
            (batches == 0 and "origin" not in state) or at_end):
        return epoch, len(loader) if at_end else 0, seed, shuffle
    if [d for d in differ if not d.startswith("world_size=")]:
        raise DatasetError(f"{where}: the loader state was saved with {', '.join(differ)} at batch "
                           f"{state['batches']} of an epoch; a place inside an epoch resumes only the same rows, "
                           "batch size and drop_last (another batch size resumes at an epoch's start or end: save "
                           "the checkpoint there to change it)", loader.handle.name)
    n, position = dealt_epoch.place({"world_size": loader.world_size, **state})
    if n == loader.world_size and position % n == 0:
        batches = position // n
        if not 0 <= batches <= len(loader):
            raise DatasetError(f"{where}: the loader state is at batch {batches}, outside the epoch's "
                               f"{len(loader)}", loader.handle.name)
        return epoch, batches, seed, shuffle
    return epoch, (n, position), seed, shuffle


def windows_to_read(window_rows: List[int], batch_size: int, drop_last: bool, skip: int,
                    stop: Optional[int] = None) -> List[Tuple[int, int, int]]:
    """``(window, batches of it not yielded, rows it carries in)`` for each window an iteration gathers when it
    starts at batch ``skip`` of the epoch (and ends before batch ``stop``, if given); ``window_rows`` are the
    rows each window takes from the files, in order.

    The batching is the loader's (:func:`.epoch_order.window_batches`): a window's rows follow the rows the
    previous one carried over, it yields every full batch of them (the last window also its partial batch,
    unless ``drop_last``) and carries the rest, its rows ``[cut, ...)``, over to the next. So the windows read
    are those from the one that yields batch ``skip`` on (up to the one that yields batch ``stop - 1``), and
    before it each window whose rows the next one read takes over (its batches are gathered, not yielded), back
    to one whose carry-out holds none of the rows it carried in (``cut`` at or past them): that one, the first
    read, is gathered after a placeholder of the rows it carries in, whose content nothing yielded or carried
    over holds. Where every window but the last holds at least ``batch_size`` rows (a loader's do), that is
    the window before the one of batch ``skip`` at most.
    """
    layout = window_batches(window_rows, batch_size, drop_last)
    counts = [count for _, _, count in layout]
    before = [sum(counts[:i]) for i in range(len(counts))]  # batches yielded before each window
    first = next((i for i, c in enumerate(counts) if before[i] + c > skip), None)
    if first is None:
        return []
    while first > 0 and layout[first][0]:  # it takes rows over: read the window they come from
        first -= 1
        kept, cut, _ = layout[first]
        if cut >= kept:  # they are its own rows: the rows it took over are not needed
            break
    end = len(counts) if stop is None else next((i for i in range(first, len(counts)) if before[i] >= stop),
                                                len(counts))
    return [(i, min(counts[i], max(0, skip - before[i])), layout[i][0]) for i in range(first, end)]


def counted(loader, epoch: int, batches: Iterable[Any], start: int, total: int) -> Iterator[Any]:
    """``batches``, the rest of ``epoch`` from batch ``start`` of ``total``, each counted into ``loader`` as it is
    yielded: ``loader.batches`` and ``loader.rows`` (summed over iterations), its place ``loader._at`` (see
    :class:`Resumable`), then ``loader.on_progress(epoch, place, total)`` where one is set. Each batch is a step
    of the rank's ``loader.step_clock`` where one is set (:class:`spark_dist.task.steps.StepClock`): the wait for
    it, then the training loop's time with it until the loop asks for the next."""
    place = start
    loader._at = (epoch, place)
    clock = getattr(loader, "step_clock", None)
    if clock is not None:
        clock.asked()
    try:
        for batch in batches:
            place += 1
            loader.batches += 1
            loader.rows += rows_of(batch)
            loader._at = (epoch, place)
            if loader.on_progress is not None:
                loader.on_progress(epoch, place, total)
            if clock is not None:
                clock.came()
            yield batch
            if clock is not None:
                clock.asked()
    finally:
        if clock is not None:
            clock.stopped()


def rows_of(batch: Any) -> int:
    """Rows in a batch (a dict, or what a transform's ``collate`` made): the length of its first sized value (0
    when nothing has one)."""
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    for value in values:
        try:
            return len(value)
        except TypeError:
            continue
    return 0


class EpochSampler:
    """``loader.sampler``: forwards ``set_epoch`` to the loader, as a ``DistributedSampler`` takes it."""

    def __init__(self, loader):
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class Resumable:
    """A ``ShardLoader``'s epoch and place in it: ``set_epoch``, ``sampler``, ``state_dict``, ``load_state_dict``.

    ``_resume_at``: ``(epoch, place)`` where the next iteration of that epoch starts (restored, not yet begun):
    a batch, or ``(origin world size, position)`` for an epoch dealt out (:mod:`.dealt_epoch`);
    ``_at``: ``(epoch, batches yielded)`` of the iteration under way or the latest one; ``_dealt``:
    ``(epoch, origin world size, start position)`` of the latest iteration when it was dealt out. An iteration
    moves them through :meth:`_begin` and :func:`counted` only; :meth:`load_state_dict` sets ``_resume_at``.
    """

    batch_sampler = None  # Lightning reads it beside ``sampler`` (a DataLoader has both)
    _resume_at: Optional[Tuple[int, Union[int, Tuple[int, int]]]] = None
    _at: Tuple[int, int] = (0, 0)
    _dealt: Optional[Tuple[int, int, int]] = None

    def _begin(self, epoch: int) -> Tuple[Union[int, Tuple[int, int]], int, int]:
        """Start an iteration of ``epoch``, taking the place restored for it: ``(place, start, total)``, where
        ``place`` is where the batches are read from (a batch, or ``(origin world size, position)`` of an epoch
        dealt out, which counts its steps from 0), ``start`` the count of batches to go on from and ``total`` the
        epoch's; :func:`counted` then keeps the place. Sets ``_dealt``."""
        place = self._resume_at[1] if self._resume_at is not None and self._resume_at[0] == epoch else 0
        self._resume_at = None
        if isinstance(place, tuple):
            self._dealt = (epoch, *place)
            return place, 0, dealt_epoch.steps_left(self, *place)
        self._dealt = None
        return place, place, len(self)

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` from now on. A position :meth:`load_state_dict` restored in another epoch is
        dropped; in this one it stays (Lightning sets the epoch after restoring a checkpoint)."""
        if self._resume_at is not None and self._resume_at[0] != epoch:
            self._resume_at = None
        self.epoch = epoch

    @property
    def sampler(self) -> EpochSampler:
        """What Lightning calls ``set_epoch`` on at each epoch's start (it never calls the loader's own)."""
        return EpochSampler(self)

    def state_dict(self) -> Dict:
        """The loader's place: the epoch and the batches already yielded in it (by the iteration under way or the
        latest one), with the seed, ``shuffle`` and what the batches depend on; plain values, for a checkpoint.
        Every rank is at the same place, so one rank's state serves all."""
        if self._resume_at is not None:
            return state_of(self, *self._resume_at)
        return state_of(self, *(self._at if self._at[0] == self.epoch else (self.epoch, 0)))

    def load_state_dict(self, state: Dict) -> None:
        """Resume at ``state`` (from :meth:`state_dict`): the next iteration yields the batches of its epoch after
        the ones already yielded, exactly those an uninterrupted epoch gives (``len(loader) - state["batches"]``
        of them), and the next epoch is whole again. A state of another number of ranks (an elastic run that
        changed size) deals the rest of its epoch out to this loader's ranks (:mod:`.dealt_epoch`).

        Raises:
            DatasetError: ``state`` is not a loader's state, or it was saved with another number of rows, or
                with another batch size or ``drop_last`` inside an epoch.
        """
        epoch, batches, self.seed, self.shuffle = checked_state(self, state)
        self.epoch, self._resume_at = epoch, (epoch, batches)

