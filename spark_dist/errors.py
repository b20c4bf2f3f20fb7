"""Error types of spark_dist.

Every error here pickles cleanly (they cross process and Spark boundaries), and this is the one place that
formats a rank's failure as ``rank 1 on host h: ...``.
"""
from __future__ import annotations

import errno
import re
import signal as _signal
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


class DatasetError(ValueError):
    """A dataset cannot be used for training; the message names the dataset, the column and what to change.

    ``dataset`` and ``column`` say which, where the error is about one (else ``None``), so that a caller can
    name its own Param for them.
    """

    def __init__(self, message: str, dataset: Optional[str] = None, column: Optional[str] = None):
        super().__init__(message)
        self.dataset, self.column = dataset, column

    def __reduce__(self):  # keep dataset and column when a rank's error travels to the driver
        return type(self), (str(self), self.dataset, self.column)


class ConfigError(ValueError):
    """A run setting is wrong. Raised on the driver before any Spark job; the message names the
    parameter or Spark conf key to change."""


class ClusterConfigError(ConfigError, RuntimeError):
    """The run does not fit how the cluster is set up: GPUs that are not scheduled (no
    ``spark.task.resource.gpu.amount``, none on the driver), ``num_processes`` not a multiple of the GPUs per
    task, or an unencrypted run on a cluster that requires encryption. Also a ``RuntimeError``, which PySpark's
    TorchDistributor raises for these and code catches (to fall back to the CPU, say)."""


class DiskFullError(OSError):
    """A file spark_dist was writing (a checkpoint) found its filesystem full: the message says so in words,
    names the directory and what was being written, and what is free there. Nothing half-written is left, and
    the checkpoint before it is intact. An ``OSError`` with ``errno.ENOSPC``."""

    def __init__(self, directory: str, what: str, free_bytes: Optional[int] = None):
        free = "" if free_bytes is None else f" ({free_bytes / 2**20:.1f} MiB free there now)"
        super().__init__(errno.ENOSPC, f"disk full: no space left on the device of {directory} while writing "
                         f"{what}{free}; the checkpoint before it is intact. Free space there, or give "
                         "spark.dist.checkpointDir (checkpoint_dir=) on a filesystem with room", directory)
        self.directory, self.what, self.free_bytes = directory, what, free_bytes

    def __reduce__(self):  # keep its fields when a rank's error travels to the driver
        return type(self), (self.directory, self.what, self.free_bytes)

    def __str__(self):
        return self.strerror


class CheckpointReadError(RuntimeError):
    """Rank 0's checkpoint, and the one before it, cannot be read: they were damaged after they were written
    (spark_dist writes each to a temporary file and renames it, so a crash mid-write never tears one). The
    message names the file and what to do; ``path`` holds it."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"checkpoint {path} cannot be read ({reason}), nor the one before it: it was damaged "
                         "after it was written (truncated, overwritten). Restore it, or delete it to start the run "
                         "from the beginning")
        self.path, self.reason = path, reason

    def __reduce__(self):  # keep its fields when a rank's error travels to the driver
        return type(self), (self.path, self.reason)


class BackendUnavailableError(ConfigError):
    """The chosen backend cannot be used here (for example Horovod is not installed)."""


class RunResized(BaseException):
    """Raised in rank 0 of an elastic run (``min_processes``) by ``ctx.save_checkpoint`` once the checkpoint is
    written, when the driver asked the run to change size: slots came back (it grows to ``num_processes``) or an
    executor running ranks is being decommissioned. The attempt ends there and the next one resumes from that
    checkpoint at the new size, not counted as a retry. A ``BaseException``, as Horovod's
    ``HostsUpdatedInterrupt`` is, so that an ``except Exception`` in the training loop lets it through: do not
    catch it."""


# Exceptions raised by a rank only because a *peer* went away: they are never the root cause.
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Gloo connectFullMesh failed",
    "HorovodInternalError",
    "Socket Timeout",
    "timed out in call to",
    # gloo ends every read and write error on a pair with this, whatever errno it saw: the peer went away.
    "typically caused by a remote worker hanging",
)


# A rank that ran out of memory: the exception types and texts that say so, host or CUDA, and where each names
# the size it asked for. The next attempt asks for as much, so it is not retried as if it were transient.
_OOM_TYPES = {"torch.OutOfMemoryError": "CUDA", "torch.cuda.OutOfMemoryError": "CUDA", "MemoryError": "host",
              "numpy._core._exceptions._ArrayMemoryError": "host", "numpy.core._exceptions._ArrayMemoryError": "host"}
_OOM_TEXTS = {"CUDA out of memory": "CUDA", "DefaultCPUAllocator: can't allocate memory": "host"}
_ASKED = (re.compile(r"[Tt]ried to allocate ([\d.]+ ?[KMGTP]?i?B)\b"),
          re.compile(r"tried to allocate (\d+) bytes"), re.compile(r"Unable to allocate ([\d.]+ ?[KMGTP]?i?B)\b"))


def _size(text: str) -> str:
    """``"8000000000000"`` (bytes) as ``"7.28 TiB"``; a size that has its unit already as it is."""
    if not text.isdigit():
        return text
    value, units = float(text), ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.2f} {units[0]}" if units[0] != "bytes" else f"{int(value)} bytes"


@dataclass
class RankFailure:
    """What one rank reported when it failed.

    ``kind`` is ``"exception"`` (the function raised), ``"signal"`` (the rank process was killed),
    ``"exit"`` (a script exited non-zero), ``"timeout"``, ``"lost"`` (its Spark task or executor went away),
    ``"cancelled"`` (someone cancelled the run's Spark job) or ``"resized"`` (rank 0 of an elastic run stopped
    at a checkpoint for the run to change size, see :class:`RunResized`: not a failure, the next attempt
    resumes). ``on_driver``: the rank ran as a process of the driver (``local_mode=True``), not in a Spark task;
    it decides which memory settings a SIGKILL points to. ``oom_killed``, for a SIGKILL: whether the kernel's OOM
    killer counted a kill in the rank's memory cgroup while it ran (``None``: no count could be read there).
    """

    rank: Optional[int]
    host: str
    kind: str
    message: str
    exc_type: str = ""
    traceback: str = ""
    signal: Optional[int] = None
    exit_code: Optional[int] = None
    time: float = 0.0
    seq: int = 0
    exception_bytes: Optional[bytes] = field(default=None, repr=False)
    on_driver: bool = False
    oom_killed: Optional[bool] = None

    @property
    def secondary(self) -> bool:
        """True when this failure only echoes another rank's: a collective that lost its partner, or a rank
        found waiting inside torch.distributed when the run timed out."""
        if self.kind == "timeout":
            return self.in_collective
        text = f"{self.exc_type} {self.message}"
        return self.kind == "exception" and any(m in text for m in _SECONDARY_MARKERS)

    @property
    def out_of_memory(self) -> Optional[Tuple[str, str]]:
        """``(where, asked)`` for a rank that raised because it ran out of memory: ``where`` is ``"CUDA"`` or
        ``"host"``, ``asked`` the size of the allocation that failed as the exception names it (``"2.00 GiB"``;
        ``"an unknown size"`` where it does not); ``None`` for any other failure."""
        if self.kind != "exception":
            return None
        where = _OOM_TYPES.get(self.exc_type)
        if where is None:
            where = next((w for text, w in _OOM_TEXTS.items() if text in self.message), None)
        if where is None:
            return None
        asked = next((m.group(1) for m in (p.search(self.message) for p in _ASKED) if m), None)
        return where, _size(asked) if asked else "an unknown size"

    @property
    def in_collective(self) -> bool:
        """The rank's dumped stack (innermost frame first) is inside torch.distributed or horovod."""
        frame = _innermost_frame(self.traceback)
        return any(p in frame for p in ("torch/distributed", "horovod/"))

    def exception(self) -> Optional[BaseException]:
        """The rank's own exception object, when it could be pickled and unpickled here."""
        if not self.exception_bytes:
            return None
        try:
            import cloudpickle

            exc = cloudpickle.loads(self.exception_bytes)
            return exc if isinstance(exc, BaseException) else None
        except Exception:  # its class may not exist on the driver: the text still tells the story
            return None

    def headline(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a task"
        if self.kind == "signal" and self.signal is not None:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            killed = f"{who} on host {self.host} was killed by signal {name} ({self.signal})"
            if self.signal != _signal.SIGKILL:
                return killed
            if self.oom_killed is False:
                return (killed + ", not by the kernel's OOM killer (its memory cgroup counted no OOM kill while it "
                        "ran): another process or a person on that host sent it, or a user-space OOM daemon "
                        "(earlyoom and the like count nothing there)")
            if self.oom_killed:
                return (killed + " by the kernel's OOM killer (its memory cgroup counted an OOM kill while it ran): "
                        + sigkill_cause(self.on_driver, known=True))
            return killed + ": " + sigkill_cause(self.on_driver)
        if self.kind == "timeout" and self.rank is not None:
            where = _innermost_frame(self.traceback)
            state = "was waiting in a collective" if self.in_collective else "stopped answering"
            return f"{who} on host {self.host} {state} ({self.message}){': at ' + where if where else ''}"
        if self.kind == "exit":
            return f"{who} on host {self.host} exited with code {self.exit_code}: {self.message}"
        memory = self.out_of_memory
        if memory is not None:
            where, asked = memory
            return (f"{who} on host {self.host} ran out of {where} memory asking for {asked} ({self.exc_type}: "
                    f"{self.message.strip().splitlines()[0][:300] if self.message.strip() else ''}). Not retried: "
                    "another attempt would ask for as much. Use smaller batches, shard the model over the ranks "
                    "(FSDP2, DeepSpeed ZeRO: docs/large_models.md), or give the ranks more memory")
        if self.exc_type and self.kind not in ("lost", "cancelled"):  # a lost task's exc_type is Spark's, not the rank's
            return f"{who} on host {self.host} raised {self.exc_type}: {self.message}"
        return f"{who} on host {self.host}: {self.message}"


def sigkill_cause(on_driver: bool, known: bool = False) -> str:
    """What sent a rank SIGKILL for memory, and the settings to change (``known``: the OOM killer's count says so;
    else the usual cause, said as a guess). Nothing catches SIGKILL, so the rank says nothing itself; its usual
    senders are the kernel's OOM killer and a cluster manager enforcing a container's memory limit (YARN,
    Kubernetes), so the text names the memory settings of where it ran."""
    if on_driver:
        return (("the driver's machine ran out of memory" if known else
                 "this is usually the machine running out of memory (the kernel's OOM killer; `dmesg` names the "
                 "process)") + ": local_mode=True runs every rank on the driver's machine, so free memory there, "
                "run fewer processes or smaller batches, or, where a cluster manager sizes the driver's container, "
                "raise spark.driver.memoryOverhead (the room outside the JVM heap) or spark.driver.memory")
    return (("the rank's memory ran out" if known else
             "this is usually memory: the executor's container went over its limit (YARN, Kubernetes) or the "
             "kernel's OOM killer ended the rank on that host") + ". Raise spark.executor.memoryOverhead (the room "
            "for Python outside the JVM heap) or spark.executor.pyspark.memory, or spark.executor.memory, or run "
            "fewer ranks per executor or smaller batches; on a local[N] master the ranks run on the driver's "
            "machine, whose memory is what ran out")


def _innermost_frame(stack: str) -> str:
    """The innermost frame of the main thread in a faulthandler dump (its outermost frame is child_main)."""
    frames = main_thread_frames(stack)
    return frames[0] if frames else ""


def main_thread_frames(stack: str) -> List[str]:
    """The frames of the main thread (the one running child_main) in a faulthandler dump, innermost first."""
    blocks: List[List[str]] = []
    current: List[str] = []
    for line in stack.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            current = []
            blocks.append(current)
        elif line.strip().startswith("File "):
            if not blocks:
                blocks.append(current)
            current.append(line.strip())
    return next((b for b in blocks if any("in child_main" in f for f in b)), blocks[0] if blocks else [])


def root_cause(failures: List[RankFailure]) -> RankFailure:
    """The failure to lead with: the earliest one that is not merely a peer's echo (torchelastic's rule)."""
    ordered = sorted(failures, key=lambda f: (f.secondary, f.seq or float("inf"), f.time))
    return ordered[0]


class TrainingFailedError(RuntimeError):
    """A distributed run failed. ``rank``, ``host``, ``exc_type``, ``remote_traceback`` describe the first
    failure (the root cause); ``failures`` maps every failed rank to its :class:`RankFailure`; ``cause`` is the
    rank's own exception object when it could be rebuilt on the driver (also set as ``__cause__``)."""

    def __init__(self, failures: List[RankFailure], attempts: int = 1, run_id: str = ""):
        self.failures_list = list(failures)
        first = root_cause(self.failures_list)
        self.first = first
        self.rank = first.rank
        self.host = first.host
        self.exc_type = first.exc_type
        self.signal = first.signal
        self.remote_traceback = first.traceback
        self.attempts = attempts
        self.run_id = run_id
        self.cause = first.exception()
        others = [f for f in self.failures_list if f is not first]
        lines = [first.headline()]
        if attempts > 1:
            lines[0] += f" (after {attempts} attempts)"
        if first.traceback:
            lines += ["", "Traceback on that rank:", first.traceback.rstrip()]
        if others:
            lines += ["", "Other ranks failed afterwards (likely consequences):"]
            lines += ["  " + f.headline() for f in others[:8]]
        super().__init__("\n".join(lines))
        if self.cause is not None:
            self.__cause__ = self.cause

    @property
    def failures(self) -> Dict[Optional[int], RankFailure]:
        return {f.rank: f for f in self.failures_list}

    def __reduce__(self):
        return (TrainingFailedError, (self.failures_list, self.attempts, self.run_id))


class RunTimeoutError(TrainingFailedError):
    """The run exceeded ``timeout`` (or a rank stopped answering)."""


class RunStalledError(RunTimeoutError):
    """No rank finished a step for ``spark.dist.stallTimeout`` while every rank was alive, and
    ``spark.dist.stallAction`` is ``fail``. The ranks behind lead ``failures``; each failure's
    ``remote_traceback`` is its rank's Python stack (all threads) as the stall found it."""

    def __reduce__(self):
        return (RunStalledError, (self.failures_list, self.attempts, self.run_id))
