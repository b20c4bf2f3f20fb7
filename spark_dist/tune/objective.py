"""What a tuning objective hands over (the training of one trial) and what a run gives back (its values).

Pure functions, no Spark: checked here so that a wrong shape fails the trial with a message naming it.
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError


def training_of(spec, number: int) -> Tuple[Any, tuple, Dict[str, Any]]:
    """``(train_object, args, kwargs)`` from what ``objective(trial)`` returned: a function or a ``.py`` path;
    or a tuple ``(train_object, args)`` or ``(train_object, args, kwargs)`` with ``args`` a list or tuple and
    ``kwargs`` a dict (a script takes its arguments as strings, ``"--lr=0.1"``, and no kwargs).

    Raises:
        ConfigError: any other shape, naming the trial.
    """
    if callable(spec) or isinstance(spec, (str, os.PathLike)):
        return spec, (), {}
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        train_object, args = spec[0], spec[1]
        kwargs = spec[2] if len(spec) == 3 else {}
        if (callable(train_object) or isinstance(train_object, (str, os.PathLike))) \
                and isinstance(args, (list, tuple)) and isinstance(kwargs, dict):
            return train_object, tuple(args), dict(kwargs)
    raise ConfigError(
        f"objective(trial) for trial {number} returned {_describe(spec)}: return the training function (or a "
        "script's path), or a tuple (train_object, args) or (train_object, args, kwargs)")


def values_of(result, last_reported: Optional[float], metric: Optional[str], n_objectives: int,
              number: int) -> Any:
    """The trial's value(s): rank 0's return value (a number, or a sequence of ``n_objectives`` numbers for a
    multi-objective study); when it returned ``None`` (a script does), the last value of ``metric`` rank 0
    reported.

    Raises:
        ValueError: neither gives a value of the study's shape, saying what came back.
    """
    if hasattr(result, "tolist") and getattr(result, "ndim", None) in (0, 1):  # a numpy array or tensor
        result = result.tolist()
    if result is None and metric is not None and last_reported is not None and n_objectives == 1:
        return float(last_reported)
    if n_objectives == 1 and _number(result):
        return float(result)
    if n_objectives == 1 and _sequence(result) and len(result) == 1 and _number(result[0]):
        return float(result[0])
    if n_objectives > 1 and _sequence(result) and len(result) == n_objectives and all(map(_number, result)):
        return [float(v) for v in result]
    wanted = "a number" if n_objectives == 1 else f"a sequence of {n_objectives} numbers"
    hint = "" if metric is not None else " (or pass metric= to take the last value rank 0 reported)"
    raise ValueError(f"trial {number}: rank 0 returned {_describe(result)}, but the study needs {wanted} as "
                     f"the trial's value{hint}")


def reported(record: Dict[str, Any], metric: str) -> Optional[float]:
    """``record``'s value of ``metric`` as a float, when it holds a finite number."""
    value = record.get(metric)
    if not _number(value):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def step_of(record: Dict[str, Any], step_keys: Sequence[str], seen: List[int]) -> int:
    """The report's own step (the first of ``step_keys`` it holds as an integer), else one more than the last
    step seen; ``seen`` holds the steps reported so far."""
    for key in step_keys:
        value = record.get(key)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return (seen[-1] + 1) if seen else 0


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _sequence(value) -> bool:
    return isinstance(value, (list, tuple))


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"
