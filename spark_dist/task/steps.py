"""A rank's training steps, counted and timed where they happen: each batch a loader from ``ctx.loader`` hands
the training loop is a step, and ``ctx.step()`` marks one where the rank has no such loader.

The rank's clock is shared with its supervisor through a small file both map (:data:`CLOCK_FILE` in the rank's
work directory; :data:`FIELDS`): numbers written in memory as they change, no system call. The supervisor sends
the step count with its heartbeat, which the driver watches for a stall (:mod:`spark_dist.driver.stall`), and the
whole clock once the rank ended, also when it was killed: the driver's split of the run's time
(:mod:`spark_dist.driver.goodput`) reads from it when the rank started and ended its function and set up its
process group, how long it waited for data and for its checkpoint saves, and when it saved last.

Each step's time is split three ways: the wait for its batch (inside the loader), the step's compute (the time
the training thread was runnable, on a CPU or queued for one: ``/proc/thread-self/schedstat``; the thread's CPU
time where that file does not exist), and the rest of the step, time blocked: in synchronous training, mostly
waiting for the peers in a collective. A rank's own time (wait and compute) is what differs between ranks that
train in lockstep, and what names a straggler (:func:`spark_dist.driver.summary.stragglers`). The latest
:data:`KEPT` steps are kept for the end-of-run distribution.
"""
from __future__ import annotations

import collections
import functools
import mmap
import os
import statistics
import struct
import sys
import threading
import time
from typing import Dict, Optional, Tuple

from ..host.import_hooks import when_imported

CLOCK_FILE = "clock"
KEPT = 4096  # steps whose times are kept (the latest): the distribution of a run's steady state
# The shared clock, float64 each; times are time.time() (the driver compares them with its own clock).
FIELDS = ("steps", "function_start", "group_start", "group_end", "first_step", "data_wait", "checkpoint_stall",
          "last_checkpoint", "data_wait_at_checkpoint", "checkpoint_stall_at_checkpoint", "function_end")
_AT = {name: 8 * i for i, name in enumerate(FIELDS)}
_CLOCK = struct.Struct(f"<{len(FIELDS)}d")
_SCHEDSTAT = "/proc/thread-self/schedstat"


def make_clock_file(workdir: str) -> str:
    """The supervisor's part: create the rank's clock file (all zero) before the rank starts."""
    path = os.path.join(workdir, CLOCK_FILE)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(bytes(_CLOCK.size))
    return path


class ClockReader:
    """The supervisor's view of the rank's clock (zeros when the file cannot be read)."""

    def __init__(self, path: str):
        self._map = None
        try:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), _CLOCK.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            pass

    def count(self) -> int:
        return int(struct.unpack_from("<d", self._map, 0)[0]) if self._map is not None else 0

    def read(self) -> Dict[str, float]:
        values = _CLOCK.unpack_from(self._map, 0) if self._map is not None else (0.0,) * len(FIELDS)
        return dict(zip(FIELDS, values))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class StepClock:
    """Counts and times one rank's steps (see the module's text). ``path``: the count file to publish the count
    in (None: counted here only)."""

    def __init__(self, path: Optional[str] = None):
        self.count = 0
        self.data_wait = self.checkpoint_stall = 0.0
        self._map = None
        if path is not None and os.path.exists(path):
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), _CLOCK.size)
        self._kept: collections.deque = collections.deque(maxlen=KEPT)  # (wait, compute, blocked) per step
        self._runnable_fds: Dict[int, int] = {}
        self._asked: Optional[Tuple[float, float]] = None  # (time, runnable) when the loop asked for a batch
        self._came: Optional[Tuple[float, float, float]] = None  # (time, runnable, wait) when the batch came
        self._marked = (time.perf_counter(), self._runnable())  # the last ctx.step() (or the clock's start)

    # -- a loader's batches -------------------------------------------------------------------------------
    def asked(self) -> None:
        """The training loop asks its loader for the next batch: the step before it (if any) ends here."""
        now, runnable = time.perf_counter(), self._runnable()
        self._close_step(now, runnable)
        self._asked = (now, runnable)

    def came(self) -> None:
        """The batch is there: a step begins."""
        now, runnable = time.perf_counter(), self._runnable()
        wait = now - self._asked[0] if self._asked is not None else 0.0
        self._came, self._asked = (now, runnable, wait), None
        self.data_wait += wait
        self._set("data_wait", self.data_wait)
        self._tick()

    def stopped(self) -> None:
        """The loader's iteration ended (its epoch is done, or the loop left it): the last step ends with the
        loop's return to the loader, already recorded; a step whose loop never came back is not timed."""
        self._came = self._asked = None

    def _close_step(self, now: float, runnable: float) -> None:
        if self._came is not None:
            began, runnable_then, wait = self._came
            compute = min(max(runnable - runnable_then, 0.0), now - began)
            self._kept.append((wait, compute, now - began - compute))
            self._came = None

    # -- ctx.step() ---------------------------------------------------------------------------------------
    def mark(self) -> None:
        """A step ended where the rank has no loader: its time since the last mark (or the rank's start) is
        compute while the thread was runnable, else blocked; it waited for no data."""
        now, runnable = time.perf_counter(), self._runnable()
        began, runnable_then = self._marked
        compute = min(max(runnable - runnable_then, 0.0), now - began)
        self._kept.append((0.0, compute, now - began - compute))
        self._marked = (now, runnable)
        self._tick()

    def _tick(self) -> None:
        if not self.count:
            self._set("first_step", time.time())
        self.count += 1
        self._set("steps", self.count)

    # -- the rest of the clock ----------------------------------------------------------------------------
    def function_started(self) -> None:
        self._set("function_start", time.time())

    def function_ended(self) -> None:
        self._set("function_end", time.time())

    def saved(self, seconds: float) -> None:
        """A checkpoint save returned after blocking the training ``seconds``: it is the one a retry resumes."""
        self.checkpoint_stall += seconds
        self._set("checkpoint_stall", self.checkpoint_stall)
        self._set("last_checkpoint", time.time())
        self._set("data_wait_at_checkpoint", self.data_wait)
        self._set("checkpoint_stall_at_checkpoint", self.checkpoint_stall)

    def time_group_setup(self) -> None:
        """Time the rank's ``init_process_group`` (torch.distributed's, now or once it is imported)."""
        when_imported("torch.distributed.distributed_c10d", self._wrap_init)

    def _wrap_init(self, c10d) -> None:
        original = getattr(c10d, "init_process_group", None)
        if original is None or getattr(original, "_spark_dist_timed", False):
            return

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            self._set("group_start", time.time())
            try:
                return original(*args, **kwargs)
            finally:
                self._set("group_end", time.time())

        init_process_group._spark_dist_timed = True  # type: ignore[attr-defined]
        c10d.init_process_group = init_process_group
        dist = sys.modules.get("torch.distributed")  # re-exported already where torch was imported first
        if dist is not None and getattr(dist, "init_process_group", None) is original:
            dist.init_process_group = init_process_group

    def _set(self, name: str, value: float) -> None:
        if self._map is not None:
            struct.pack_into("<d", self._map, _AT[name], value)

    def _runnable(self) -> float:
        """Seconds the calling thread has been runnable (on a CPU, or waiting for one)."""
        ident = threading.get_ident()
        fd = self._runnable_fds.get(ident)
        if fd is None:
            try:
                fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            except OSError:
                fd = -1
            self._runnable_fds[ident] = fd
        if fd >= 0:
            try:
                on_cpu, queued = os.pread(fd, 64, 0).split()[:2]
                return (int(on_cpu) + int(queued)) / 1e9
            except (OSError, ValueError):
                pass
        return time.thread_time()

    # -- the distribution ---------------------------------------------------------------------------------
    def summary(self) -> Dict[str, float]:
        """The kept steps' medians (seconds): ``step_p50`` and ``step_p90`` (a whole step), ``wait_p50`` (data),
        ``compute_p50``, ``blocked_p50``, and ``own_p50`` (wait and compute: what the rank itself took);
        with ``steps`` (all steps counted) and ``timed_steps`` (those the medians are over). Empty before the
        first timed step."""
        if not self._kept:
            return {"steps": self.count} if self.count else {}
        kept = list(self._kept)
        whole = sorted(w + c + b for w, c, b in kept)
        return {
            "steps": self.count, "timed_steps": len(kept),
            "step_p50": _r(statistics.median(whole)), "step_p90": _r(whole[int(0.9 * (len(whole) - 1))]),
            "wait_p50": _r(statistics.median(w for w, _, _ in kept)),
            "compute_p50": _r(statistics.median(c for _, c, _ in kept)),
            "blocked_p50": _r(statistics.median(b for _, _, b in kept)),
            "own_p50": _r(statistics.median(w + c for w, c, _ in kept)),
        }

    def close(self) -> None:
        for fd in self._runnable_fds.values():
            if fd >= 0:
                os.close(fd)
        self._runnable_fds.clear()
        if self._map is not None:
            self._map.close()
            self._map = None


def _r(seconds: float) -> float:
    return round(seconds, 6)
