"""The ranks' ``ctx.report`` records as the first task keeps them under Spark Connect (:mod:`.first_task`).

Connect has no channel from the executors to the client while a job runs, so the first task holds the
records until the attempt ends and returns them in one value (a pickled Arrow cell, or the error that fails
the stage). :class:`ReportTail` keeps that value bounded however long the run and however often it reports:

- the latest :data:`PER_RANK` records of each rank (metrics and ``log_to_driver`` messages);
- every record that changes what the driver keeps, whatever the count: a sharded checkpoint's commit (the
  driver's list of kept checkpoints is rebuilt from all of them, in order) and a rank's input statistics (one
  a rank);
- a count of the records dropped, each rank's, which the client shows as a ``log_to_driver`` line before
  the records kept.

Records come out in the order they arrived. Pure: no store, no Spark, no torch.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from ..wire.protocol import INPUT_STATS_KEY, LOG_KEY
from ..task.sharded_checkpoints import CHECKPOINT_KEY

PER_RANK = 1000  # the latest records kept of each rank's (at a few hundred bytes a record)
def always_kept(record: dict) -> bool:
    """Whether ``record`` changes what the driver keeps (a checkpoint commit, a rank's input statistics): never
    dropped. Resize records are the driver's own and never pass here."""
    return CHECKPOINT_KEY in record or INPUT_STATS_KEY in record


class ReportTail:
    """The reports the first task hands back: call it with each record as it arrives (the coordinator's
    ``on_report``), then read :meth:`items`. Holds at most ``per_rank`` (default :data:`PER_RANK`) droppable
    records of each rank.

    Raises:
        ValueError: ``per_rank`` below 1.
    """

    def __init__(self, per_rank: Optional[int] = None):
        per_rank = PER_RANK if per_rank is None else per_rank
        if per_rank < 1:
            raise ValueError(f"per_rank must be at least 1, got {per_rank}")
        self.per_rank = per_rank
        self._order = itertools.count()  # arrival numbers: items() merges the kinds back into arrival order
        self._kept: List[Tuple[int, dict]] = []
        self._latest: Dict[Optional[int], Deque[Tuple[int, dict]]] = {}
        self.dropped: Dict[Optional[int], int] = {}  # rank -> records dropped

    def __call__(self, record: dict) -> None:
        arrival = next(self._order)
        if always_kept(record):
            self._kept.append((arrival, record))
            return
        rank = record.get("rank")
        latest = self._latest.setdefault(rank, deque())
        latest.append((arrival, record))
        if len(latest) > self.per_rank:
            latest.popleft()
            self.dropped[rank] = self.dropped.get(rank, 0) + 1

    def items(self) -> Tuple[dict, ...]:
        """The records kept, in arrival order, after one ``log_to_driver`` record saying how many were dropped
        (none when nothing was)."""
        merged = sorted(itertools.chain(self._kept, *self._latest.values()), key=lambda kept: kept[0])
        records = tuple(record for _, record in merged)
        notice = self.notice()
        return records if notice is None else ({LOG_KEY: notice},) + records

    def notice(self) -> Optional[str]:
        """The line telling the driver how many reports were dropped, each rank's; ``None`` when none were."""
        if not self.dropped:
            return None
        counts = ", ".join(f"{count} of rank {rank}" for rank, count in sorted(self.dropped.items(), key=_by_rank))
        total = sum(self.dropped.values())
        return (f"[spark_dist] {total} earlier ctx.report records were dropped ({counts}): under Spark Connect the "
                f"first task keeps the latest {self.per_rank} of each rank's, and every checkpoint and rank's input "
                "statistics, until the attempt ends")


def _by_rank(item: Tuple[Optional[int], int]) -> Tuple[int, int]:
    rank = item[0]
    return (0, rank) if isinstance(rank, int) else (1, 0)


__all__ = ["ReportTail", "PER_RANK", "always_kept"]
