"""A run that stopped moving while its ranks are alive: told apart, then diagnosed from every rank's stack.

The ranks' step counts come with their supervisors' heartbeats (:mod:`spark_dist.task.steps`). Once a rank has
counted a step, :class:`StallWatch` watches the counts: when none has moved for ``spark.dist.stallTimeout``
(while the beats go on: a silent host is :mod:`~spark_dist.driver.coordinator`'s other watch), the driver asks
every supervisor for its rank's Python stack (all threads) and :func:`diagnose` groups the ranks by where their
main thread waits: the ranks behind (the fewest steps; with equal counts, those apart from the largest group)
are named first, with the line of their own code they wait in. ``spark.dist.stallAction`` says what follows:
``warn`` prints it (the run goes on, and is watched again once it moved), ``fail`` ends the run with
:class:`~spark_dist.errors.RunStalledError`, which carries the stacks.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import main_thread_frames

_PEER_WAIT = re.compile(r"torch/distributed/|torch/nn/parallel/|torch/autograd/|horovod/|spark_dist/horovod/")
STACKS_WAIT_S = 5.0  # how long the driver waits for the supervisors' stacks (STACKS_LOOK_EVERY beats, then a 1 s dump)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames of Python's, the libraries' and spark_dist's own files: "their own code" is the innermost frame elsewhere.
_LIBRARY = re.compile(r"site-packages/|dist-packages/|/lib/python3[.\d]*/|<frozen |"
                      r"/spark_dist/(task|data|driver|wire|host|backends|horovod|ml|inference|tune|spark|cli)/")


@dataclass
class RankStack:
    rank: int
    host: str
    steps: int
    stack: str  # the supervisor's dump (or why there is none)
    nccl_trace: Optional[bytes] = field(default=None, repr=False)  # its Flight Recorder dump (ranks on GPUs)

    @functools.cached_property
    def frames(self) -> List[str]:
        """The main thread's frames, innermost first (parsed once: grouping and naming ask often)."""
        return main_thread_frames(self.stack)

    @property
    def frame(self) -> str:
        """The innermost frame of the main thread: where the rank waits."""
        return _short(self.frames[0]) if self.frames else "(no stack)"

    @property
    def waits_for_peers(self) -> bool:
        """The main thread's innermost frame is in a collective, or in a backward pass (DDP's all-reduce)."""
        return bool(self.frames) and _PEER_WAIT.search(self.frames[0]) is not None

    @property
    def own_frame(self) -> Optional[str]:
        """The innermost frame of the main thread in the user's own code (None: there is none, or it is the
        innermost frame itself)."""
        own = next((f for f in self.frames if not _LIBRARY.search(f)), None)
        return None if own is None or own == self.frames[0] else _short(own)


@dataclass
class StallDiagnosis:
    """What the driver saw: how long nothing moved, every rank's stack, and who is behind."""

    seconds: float
    ranks: List[RankStack]
    behind: List[int] = field(default_factory=list)
    number: int = 1  # the run's how-manieth stall

    def groups(self) -> List[Tuple[str, List[RankStack]]]:
        """Ranks by the frame they wait in: the group of the ranks behind first, then by size."""
        by_frame: Dict[str, List[RankStack]] = {}
        for r in self.ranks:
            by_frame.setdefault(r.frame, []).append(r)
        return sorted(by_frame.items(), key=lambda item: (not any(r.rank in self.behind for r in item[1]),
                                                          -len(item[1]), item[1][0].rank))

    def headline(self) -> str:
        names = _names(self.behind)
        places = len({r.frame for r in self.ranks})
        who = (f"{names} {'is' if len(self.behind) == 1 else 'are'} behind" if self.behind else
               "every rank waits in the same place" if places == 1 else f"the ranks wait in {places} places")
        return (f"no rank has finished a step for {self.seconds:.0f}s while all are alive "
                f"(spark.dist.stallTimeout): {who}")

    def lines(self) -> List[str]:
        """The diagnosis as the console shows it: the headline, then a line for each group of ranks."""
        out = [self.headline()]
        for frame, ranks in self.groups():
            first = ranks[0]
            steps = sorted({r.steps for r in ranks})
            at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
            own = f", from {first.own_frame}" if first.own_frame else ""
            hosts = sorted({r.host for r in ranks})
            out.append(f"  {_names([r.rank for r in ranks])} (on {', '.join(hosts)}) after {at}, waiting in "
                       f"{frame}{own}")
        return out

    def text(self) -> str:
        """The whole diagnosis with every rank's stack (the MLflow artifact, the error's traceback)."""
        parts = self.lines() + [""]
        for r in sorted(self.ranks, key=lambda r: r.rank):
            parts += [f"--- rank {r.rank} on {r.host}, {r.steps} steps ---", r.stack.rstrip(), ""]
        return "\n".join(parts)


def diagnose(seconds: float, ranks: Sequence[RankStack], number: int = 1) -> StallDiagnosis:
    """Who is behind: the ranks with the fewest steps when the counts differ; else the ranks not waiting for
    their peers (in a collective, or in a backward pass whose all-reduce waits) while others are; else those
    waiting apart from the largest group of ranks; none when all wait in one place."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    counts = {r.steps for r in ranks}
    if len(counts) > 1:
        least = min(counts)
        return StallDiagnosis(seconds, list(ranks), [r.rank for r in ranks if r.steps == least], number)
    apart = [r.rank for r in ranks if not r.waits_for_peers]
    if apart and len(apart) < len(ranks):
        return StallDiagnosis(seconds, list(ranks), apart, number)
    by_frame: Dict[str, List[int]] = {}
    for r in ranks:
        by_frame.setdefault(r.frame, []).append(r.rank)
    largest = max(by_frame.values(), key=len) if by_frame else []
    ties = [g for g in by_frame.values() if len(g) == len(largest)]
    behind = [] if len(by_frame) < 2 or len(ties) > 1 else sorted(
        rank for g in by_frame.values() if g is not largest for rank in g)
    return StallDiagnosis(seconds, list(ranks), behind, number)


class StallWatch:
    """Tells, from the step counts the driver reads with each look at the heartbeats, when a stall begins.

    ``observe(now, counts)`` returns True once per stall: when no rank's count (of those still running) has
    moved for ``timeout`` seconds, once some rank has counted a step in this attempt. A stall ends when a
    count moves again; then the next may begin."""

    def __init__(self, timeout: float, action: str = "warn"):
        self.timeout = timeout if action != "off" else 0.0
        self.counts: Dict[int, int] = {}
        self.moved_at: Optional[float] = None
        self.stalled = False
        self.stalls = 0

    def observe(self, now: float, counts: Dict[int, int]) -> bool:
        moved = any(counts[r] > self.counts.get(r, 0) for r in counts)
        self.counts.update(counts)
        if moved or self.moved_at is None:
            if moved:
                self.moved_at, self.stalled = now, False
            return False
        if self.stalled or self.timeout <= 0 or now - self.moved_at < self.timeout:
            return False
        self.stalled = True
        self.stalls += 1
        return True

    def still_for(self, now: float) -> float:
        return 0.0 if self.moved_at is None else now - self.moved_at


def _short(frame: str) -> str:
    """``File "/a/b/train.py", line 12 in step`` as ``train.py:12 (step)``."""
    m = _FRAME.search(frame)
    if m is None:
        return frame
    return f"{m['file'].rsplit('/', 1)[-1]}:{m['line']} ({m['func']})"


def _names(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
