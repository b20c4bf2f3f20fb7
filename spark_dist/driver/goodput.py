"""Where a run's time went: its wall time split, attempt by attempt, into parts that add up to it, and its goodput
(the training's share).

The driver knows when it started the run, began waiting for an attempt's slots, submitted its job, saw it
aborted and saw it end; each rank's clock (:mod:`spark_dist.task.steps`, sent by its supervisor once the rank
ended, also when it was killed) says when the rank entered and left its function and set up its process group,
and how long rank 0 waited for data and for its checkpoint saves and when it saved last. Times from the
executors are ``time.time()`` of their hosts, compared with the driver's: clocks kept in step (NTP) are assumed.

The parts of an attempt (:data:`PARTS`), in the order they happen:

- ``setup``: the first attempt only: the run's checks, pickling and dataset caches before it waited for slots;
- ``recovery``: after an attempt that failed or stopped to resize: from the moment the driver saw it end its
  work (the abort) to this attempt's wait for slots: the failed attempt's teardown and the wait to retry;
- ``slots``: waiting for free task slots (behind this process's other runs too);
- ``launch``: the job submitted -> every rank in the user's function;
- ``process_group``: rank 0's ``init_process_group`` once every rank was in its function;
- ``data_wait``, ``checkpoint_stall``: rank 0's wait for batches and the blocking part of its saves;
- ``lost_work``: an attempt that failed: its training after its last checkpoint, done again by the next;
- ``training``: the rest of rank 0's time in its function (its steps, evaluation, what it built);
- ``teardown``: the end of rank 0's function (or the failure) -> the attempt's end, and the driver's own end of
  the run after the last attempt (unpickling the result, the summary).

Where rank 0's clock was lost (its Python worker killed, and its supervisor with it), the lowest rank that told
one stands in for it. Goodput is training over the wall time. ``recovery_seconds`` (MLflow) is the whole cost of
each failure: from the abort to the first step of the attempt after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

PARTS = ("setup", "recovery", "slots", "launch", "process_group", "training", "data_wait", "checkpoint_stall",
         "lost_work", "teardown")


@dataclass
class AttemptTimes:
    """What the driver noted of one attempt (``time.time()`` values) and the ranks' clocks."""

    attempt: int
    world_size: int
    ending: str  # "succeeded", "failed", "resized", "timed out" or "interrupted" (Ctrl-C, a stopped trial)
    queued_at: float
    submitted_at: Optional[float]
    ended_at: float
    failed_at: Optional[float] = None
    clocks: Dict[int, dict] = field(default_factory=dict)


def split(run_started: float, run_ended: float, attempts: List[AttemptTimes]) -> List[Dict[str, float]]:
    """A row per attempt: ``attempt``, ``world_size``, ``ending``, each of :data:`PARTS` in seconds, ``wall``
    (their sum), ``goodput``, and ``first_step`` (time.time() of rank 0's first step; None: none).

    The parts add up to ``run_ended - run_started`` by construction: each attempt's moments are held in order
    (a moment noted out of order, by another clock, is moved to its neighbour), and the ranks' own waits are cut
    to the attempt's working time, the latest first, where a rank went on waiting after the driver saw the
    attempt fail (a save blocked on the lost rank until it was stopped: that time is the next attempt's
    recovery)."""
    rows, work_ended = [], run_started
    for i, times in enumerate(attempts):
        last = i == len(attempts) - 1
        parts = dict.fromkeys(PARTS, 0.0)
        queued = max(times.queued_at, work_ended)
        parts["setup" if i == 0 else "recovery"] = queued - work_ended
        submitted = max(times.submitted_at or queued, queued)
        parts["slots"] = submitted - queued
        work_end = max(times.failed_at or _clock(times, _first_rank(times), "function_end") or times.ended_at,
                       submitted)
        all_in = min(max(_all_in(times) or work_end, submitted), work_end)
        parts["launch"] = all_in - submitted
        rank0 = times.clocks.get(_first_rank(times), {})
        group = max(0.0, rank0.get("group_end", 0.0) - max(rank0.get("group_start", 0.0), all_in))
        data, stall = rank0.get("data_wait", 0.0), rank0.get("checkpoint_stall", 0.0)
        parts["process_group"], parts["data_wait"], parts["checkpoint_stall"] = group, data, stall
        if times.ending in ("failed", "timed out") and rank0.get("first_step"):
            since = rank0.get("last_checkpoint") or rank0["first_step"]
            waited = (data - rank0.get("data_wait_at_checkpoint", 0.0)) + \
                (stall - rank0.get("checkpoint_stall_at_checkpoint", 0.0))
            parts["lost_work"] = max(0.0, work_end - since - waited)
        excess = sum(parts[p] for p in _WAITS) - (work_end - all_in)
        for part in _WAITS:  # what a rank counted past the attempt's work: the latest kinds of wait first
            cut = min(max(excess, 0.0), parts[part])
            parts[part] -= cut
            excess -= cut
        parts["training"] = (work_end - all_in) - sum(parts[p] for p in _WAITS)
        ended = max(times.ended_at, work_end)
        if times.ending == "succeeded" or last:
            parts["teardown"] = ended - work_end + (max(run_ended - ended, 0.0) if last else 0.0)
        parts = {k: round(max(v, 0.0), 3) for k, v in parts.items()}
        wall = round(sum(parts.values()), 3)
        rows.append({"attempt": times.attempt, "world_size": times.world_size, "ending": times.ending, **parts,
                     "wall": wall, "goodput": round(parts["training"] / wall, 4) if wall else 0.0,
                     "first_step": rank0.get("first_step") or None})
        work_ended = work_end
    return rows


def recovery_seconds(attempts: List[AttemptTimes]) -> float:
    """Each failure's cost, summed: from the abort to rank 0's first step in the attempt after it."""
    total = 0.0
    for failed, nxt in zip(attempts, attempts[1:]):
        first = _clock(nxt, _first_rank(nxt), "first_step")
        if failed.failed_at and first:
            total += first - failed.failed_at
    return round(total, 3)


def totals(rows: List[Dict[str, float]]) -> Dict[str, float]:
    """The run's parts summed over its attempts, its wall time and goodput."""
    summed = {part: round(sum(r[part] for r in rows), 3) for part in PARTS}
    wall = round(sum(r["wall"] for r in rows), 3)
    return {**summed, "wall": wall, "goodput": round(summed["training"] / wall, 4) if wall else 0.0}


def line(rows: List[Dict[str, float]]) -> str:
    """The summary's line: goodput, then every part that took a tenth of a second or more, largest first."""
    total = totals(rows)
    shown = sorted(((total[p], p) for p in PARTS if p != "training" and total[p] >= 0.1), reverse=True)
    rest = "; ".join(f"{p.replace('_', ' ')} {s:.1f}s" for s, p in shown)
    return (f"goodput {total['goodput']:.0%}: training {total['training']:.1f}s of {total['wall']:.1f}s"
            + (f"; {rest}" if rest else ""))


# The parts taken out of an attempt's working time before its training, in the order they are cut where the
# ranks' clocks count more than that time: a failure's lost work and a save or a batch still awaited when it came.
_WAITS = ("lost_work", "checkpoint_stall", "data_wait", "process_group")


def _clock(times: AttemptTimes, rank: int, name: str) -> float:
    return times.clocks.get(rank, {}).get(name, 0.0)


def _first_rank(times: AttemptTimes) -> int:
    """Rank 0, or where its clock was lost (its Python worker killed with its supervisor) the lowest rank that
    told one: the ranks step together, so its times stand for rank 0's."""
    return 0 if 0 in times.clocks or not times.clocks else min(times.clocks)


def _all_in(times: AttemptTimes) -> Optional[float]:
    """When the last rank entered its function, as far as the ranks that told their clocks say (None: none)."""
    starts = [c.get("function_start", 0.0) for c in times.clocks.values() if c.get("function_start")]
    return max(starts) if starts else None
