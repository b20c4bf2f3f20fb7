"""Which sharded checkpoints are the best, by the score their saves recorded: the one ranking that rank 0's
retention (``keep=k`` with a ``metric``) and the driver's ``Distributor.best_checkpoint`` both use, so the
checkpoint the driver names is always one retention kept.

The ranking is a total order, whatever the scores: a score that is not a finite number (NaN, an infinity, or
none) ranks after every finite one, so a diverged epoch's checkpoint never displaces the real best; among equal
scores the earlier checkpoint ranks first. ``mode="min"`` ranks the lowest score first, ``"max"`` the highest.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, TypeVar

MODES = ("min", "max")

T = TypeVar("T")


def finite(score: Any) -> bool:
    """Whether ``score`` is a number that ranks (not ``None``, NaN or an infinity)."""
    return isinstance(score, numbers.Real) and not isinstance(score, bool) and math.isfinite(score)


def rank_key(score: Any, mode: str) -> Tuple[int, float]:
    """The sort key of ``score`` under ``mode``: best first, every score that is not :func:`finite` last."""
    if not finite(score):
        return (1, 0.0)
    return (0, float(score) if mode == "min" else -float(score))


def best_of(items: Sequence[T], keep: int, mode: str, score: Callable[[T], Any]) -> List[T]:
    """The ``keep`` best of ``items`` (oldest first, ``score(item)`` each) that have a finite score, best first;
    ``[]`` when none has one."""
    ranked = sorted((item for item in items if finite(score(item))), key=lambda item: rank_key(score(item), mode))
    return ranked[:keep]


def retained(found: Sequence[T], keep: Optional[int], mode: str, score: Callable[[T], Any]) -> List[T]:
    """What retention keeps of ``found`` (oldest first): all without ``keep``; else the ``keep`` best with a
    finite score, or the ``keep`` latest when none has one; and always the latest, to resume from."""
    if keep is None:
        return list(found)
    best = best_of(found, keep, mode, score) or list(found[-keep:])
    return [item for item in found if any(item is b for b in best) or item is found[-1]]


def score_of(metric: str, metrics: Mapping[str, Any], rank: int) -> float:
    """The score of a save that named ``metric``: its latest value in ``metrics`` (what rank ``rank``, rank 0,
    reported), as a float. NaN and infinities are scores too (they rank last).

    Raises:
        ValueError: ``metric`` was never reported, or its value is not a number.
    """
    if metric not in metrics:
        reported = ", ".join(sorted(metrics)) or "none"
        raise ValueError(f"save_checkpoint: metric {metric!r} was never reported by rank {rank} with "
                         f"ctx.report({metric}=...) (rank {rank}'s value is the checkpoint's score); reported so "
                         f"far: {reported}")
    try:
        return float(metrics[metric])
    except (TypeError, ValueError):
        raise ValueError(f"save_checkpoint: metric {metric!r} is {metrics[metric]!r}, not a number to rank "
                         "checkpoints by") from None


__all__ = ["MODES", "best_of", "finite", "rank_key", "retained", "score_of"]
