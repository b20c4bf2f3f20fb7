"""The faults the campaign injects into a running workload, each from a seeded draw: its target (a rank) and
its moment (a training step of the run's first attempt, as a fraction of all its steps: a moment in the
training however fast the machine runs it), the kind from :data:`KINDS`. A fault waits for its target's beacon
and rank 0's step (tests/chaos/workload.py), acts, and records when it acted; a run that ended first leaves it
unfired. Each kind also says which ending the docs promise for it (:class:`Ending`)."""
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from chaos.workload import STEPS

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class Ending:
    """What the docs promise once the fault fired: ``error`` None for a success with the weights of a fault-free
    run, else the error's class name, with the rank it must name (None: any) and the class of the rank's own
    exception (``cause``); ``rerun``: the same run_id run again then succeeds with the fault-free weights;
    ``may_succeed``: the fault may hit nothing the run still needs (a disk filled after the last save, a
    damaged checkpoint with a whole one before it), and then the run succeeds with the same weights."""
    error: Optional[str] = None
    rank_named: Optional[int] = None
    rerun: bool = False
    cause: Optional[str] = None
    may_succeed: bool = False


@dataclass
class Fault:
    kind: str
    rank: int
    at: float  # when: after this fraction of the first attempt's training steps
    hold: float = 0.0  # SIGSTOP: seconds before SIGCONT
    delay: float = 0.0  # about when ``at`` comes, in seconds after the rank started (for the run's bounds)
    fired_at: Optional[float] = None
    note: str = ""
    _stopped: list = field(default_factory=list, repr=False)

    def describe(self) -> str:
        return (f"{self.kind}(rank {self.rank}, after step {self.step} of {STEPS}"
                f"{f', hold {self.hold:.1f}s' if self.hold else ''})")

    @property
    def step(self) -> int:
        """Rank 0's training step after which the fault acts."""
        return max(1, round(self.at * STEPS))

    def ending(self) -> Ending:
        return ENDINGS[self.kind](self)


ENDINGS = {
    "kill_rank": lambda f: Ending(),
    "stop_rank": lambda f: Ending(),
    "freeze_rank": lambda f: Ending(error="RunTimeoutError", rank_named=f.rank),
    "kill_worker": lambda f: Ending(),
    "delete_checkpoint": lambda f: Ending(),
    "truncate_checkpoint": lambda f: Ending(error="TrainingFailedError", cause="CheckpointReadError",
                                            may_succeed=True),
    "hostile_client": lambda f: Ending(),
    "interrupt_driver": lambda f: Ending(error="KeyboardInterrupt", rerun=True),
    "full_disk": lambda f: Ending(error="TrainingFailedError", cause="DiskFullError", may_succeed=True),
}
KINDS = tuple(ENDINGS)
ROOT_ONLY = ("full_disk",)  # a small tmpfs under the checkpoint directory needs a mount


def beacon(beacons: str, rank: int, attempt: int = 0, timeout: float = 120.0, done=None) -> Optional[dict]:
    """Rank ``rank``'s beacon of ``attempt`` once it is there; None when ``done`` is set first."""
    path = os.path.join(beacons, f"a{attempt}-r{rank}.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (done is not None and done.is_set()):
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        time.sleep(0.02)
    return None


class Injector(threading.Thread):
    """Fires ``fault`` into the run whose ranks write to ``beacons``, its checkpoints in ``run_dir``."""

    def __init__(self, fault: Fault, beacons: str, run_dir: str, run_id: str, disk: Optional[str] = None):
        super().__init__(daemon=True, name=f"chaos-{fault.kind}")
        self.fault, self.beacons, self.run_dir, self.run_id, self.disk = fault, beacons, run_dir, run_id, disk
        self.done = threading.Event()  # the run ended
        self.hostile = None
        if fault.kind == "hostile_client":  # made now: it leaves alone the ports that listen before the run
            from hostile_store import HostileClient

            self.hostile = HostileClient(run_id)

    def run(self):
        target = beacon(self.beacons, self.fault.rank, done=self.done)
        if target is None or not self._stepped(self.fault.step):
            return
        getattr(self, "_" + self.fault.kind)(target)

    def _stepped(self, step: int) -> bool:
        """Wait until rank 0 finished ``step`` steps of the first attempt; False when the run ended first."""
        path = os.path.join(self.beacons, "steps")
        while not self.done.wait(0.01):
            if os.path.exists(path):
                with open(path) as f:
                    if sum(1 for line in f if line.startswith("0 ")) >= step:
                        return True
        return False

    def _fired(self, note: str = "") -> None:
        self.fault.fired_at, self.fault.note = time.time(), note

    def _signal(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _kill_rank(self, target):
        if self._signal(target["pid"], signal.SIGKILL):
            self._fired()

    def _stop_rank(self, target):
        if self._signal(target["pid"], signal.SIGSTOP):
            self._fired()
            time.sleep(self.fault.hold)
            self._signal(target["pid"], signal.SIGCONT)

    def _freeze_rank(self, target):
        if self._signal(target["pid"], signal.SIGSTOP):
            self._fired()
            self.fault._stopped.append(target["pid"])

    def _kill_worker(self, target):
        if self._signal(target["ppid"], signal.SIGKILL):
            self._fired(f"python worker {target['ppid']}")

    def _checkpoint(self) -> Optional[str]:
        path = os.path.join(self.run_dir, CHECKPOINT_FILE)
        while not os.path.exists(path):
            if self.done.wait(0.02):
                return None
        return path

    def _delete_checkpoint(self, target):
        path = self._checkpoint()
        if path is not None:
            os.unlink(path)
            self._kill_rank(target)

    def _truncate_checkpoint(self, target):
        path = self._checkpoint()
        if path is not None:
            with open(path, "r+b") as f:
                f.truncate(os.fstat(f.fileno()).st_size // 2)
            self._kill_rank(target)

    def _hostile_client(self, target):
        self.hostile.start()
        self._fired()

    def _interrupt_driver(self, target):
        import _thread

        _thread.interrupt_main()
        self._fired()

    def _full_disk(self, target):
        filler = os.path.join(self.disk, "filler")
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        self._fired(f"{self.disk} filled")

    def finish(self) -> None:
        """The run ended: stop what is still acting (the hostile client), wake a waiting injector."""
        self.done.set()
        if self.hostile is not None and self.hostile.is_alive():
            self.hostile.stop.set()
            self.hostile.join(10)
        self.join(30)
