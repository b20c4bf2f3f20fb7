"""The Python worker's predict functions, kept between tasks: PySpark's ``ModelCache`` policy, with the loading
made once per key and an evicted model's memory given back.

Keys are one per :func:`predict_batch_udf` call on the driver (a fresh UDF loads afresh, as in PySpark: its
``make_predict_fn`` may read a model file that changed). The cache lives in the module, so it lasts as long
as the Python worker: across tasks, stages and jobs of the session while Spark reuses the worker
(``spark.python.worker.reuse``, on by default), and it is gone when Spark stops an idle worker (after a
minute) or the executor. At most ``SPARK_DIST_PREDICT_CACHE_SIZE`` (default 3, PySpark's number) functions
are kept per worker, the least recently used dropped first; a dropped one is released (``gc`` and, where torch
holds CUDA memory, ``torch.cuda.empty_cache``) before the next model loads.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
from collections import OrderedDict
from typing import Callable, Dict

from ..task import warm_imports

SIZE_ENV = "SPARK_DIST_PREDICT_CACHE_SIZE"
DEFAULT_SIZE = 3

_functions: "OrderedDict[str, Callable]" = OrderedDict()
_lock = threading.Lock()
_loading: Dict[str, threading.Lock] = {}


def capacity() -> int:
    """Functions kept per worker: ``SPARK_DIST_PREDICT_CACHE_SIZE`` (set it for the executors with
    ``spark.executorEnv.SPARK_DIST_PREDICT_CACHE_SIZE``), at least 1."""
    try:
        return max(1, int(os.environ.get(SIZE_ENV, DEFAULT_SIZE)))
    except ValueError:
        return DEFAULT_SIZE


def get_or_load(key: str, make_predict_fn: Callable[[], Callable]) -> Callable:
    """The predict function for ``key``: the cached one, or ``make_predict_fn()``'s, cached (one load per key
    even when tasks of one worker ask at once).

    Raises:
        TypeError: ``make_predict_fn`` returned something that is not callable.
    """
    with _lock:
        fn = _functions.get(key)
        if fn is not None:
            _functions.move_to_end(key)
            return fn
        loading = _loading.setdefault(key, threading.Lock())
    with loading:
        with _lock:
            fn = _functions.get(key)
        if fn is not None:
            return fn
        _release(_make_room(capacity() - 1))  # the old models go before the new one loads
        warm_imports.warmed()  # a training run's background imports first: two threads importing can deadlock
        fn = make_predict_fn()
        if not callable(fn):
            raise TypeError(f"make_predict_fn returned {type(fn).__name__}, not the predict function")
        with _lock:
            _functions[key] = fn
            _loading.pop(key, None)
    _release(_make_room(capacity()))
    return fn


def _make_room(keep: int) -> list:
    with _lock:
        dropped = []
        while len(_functions) > keep:
            dropped.append(_functions.popitem(last=False)[1])
        return dropped


def _release(dropped: list) -> None:
    if not dropped:
        return
    dropped.clear()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def clear() -> None:
    """Drop every cached function of this worker (tests; a user freeing memory in a long-lived worker)."""
    _release(_make_room(0))


def keys() -> list:
    """The cached keys, least recently used first."""
    with _lock:
        return list(_functions)
