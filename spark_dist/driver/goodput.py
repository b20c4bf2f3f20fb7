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

Goodput is training over the wall time. ``recovery_seconds`` (MLflow) is the whole cost of each failure: from
the abort to the first step of the attempt after it.
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
    (their sum), ``goodput``, and ``first_step`` (time.time() of rank 0's first step; None: none)."""
    rows, work_ended = [], run_started
    for i, times in enumerate(attempts):
        last = i == len(attempts) - 1
        parts = dict.fromkeys(PARTS, 0.0)
        if i == 0:
            parts["setup"] = times.queued_at - run_started
        else:
            parts["recovery"] = times.queued_at - work_ended
        submitted = times.submitted_at or times.queued_at
        parts["slots"] = submitted - times.queued_at
        work_end = times.failed_at or _clock(times, 0, "function_end") or times.ended_at
        all_in = _all_in(times) or work_end
        all_in = min(max(all_in, submitted), work_end)
        parts["launch"] = all_in - submitted
        rank0 = times.clocks.get(0, {})
        group = max(0.0, rank0.get("group_end", 0.0) - max(rank0.get("group_start", 0.0), all_in))
        data, stall = rank0.get("data_wait", 0.0), rank0.get("checkpoint_stall", 0.0)
        parts["process_group"], parts["data_wait"], parts["checkpoint_stall"] = group, data, stall
        if times.ending in ("failed", "timed out") and rank0.get("first_step"):
            since = rank0.get("last_checkpoint") or rank0["first_step"]
            waited = (data - rank0.get("data_wait_at_checkpoint", 0.0)) + \
                (stall - rank0.get("checkpoint_stall_at_checkpoint", 0.0))
            parts["lost_work"] = max(0.0, work_end - since - waited)
        busy = group + data + stall + parts["lost_work"]
        parts["training"] = max(0.0, work_end - all_in - busy)
        if times.ending == "succeeded" or last:
            parts["teardown"] = times.ended_at - work_end + ((run_ended - times.ended_at) if last else 0.0)
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
        first = _clock(nxt, 0, "first_step")
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


def _clock(times: AttemptTimes, rank: int, name: str) -> float:
    return times.clocks.get(rank, {}).get(name, 0.0)


def _all_in(times: AttemptTimes) -> Optional[float]:
    """When the last rank entered its function (None: some rank never told)."""
    starts = [c.get("function_start", 0.0) for c in times.clocks.values()]
    if len(starts) < times.world_size or not all(starts):
        return None
    return max(starts)
