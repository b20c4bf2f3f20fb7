"""The faults the campaign injects into a running workload, each from a seeded draw: its target (a rank) and
its moment (a training step of the run's first attempt, as a fraction of all its steps: a moment in the
training however fast the machine runs it), the kind from :data:`KINDS` (on any session of two slots: the suite
runs them on ``local[2]``) or :data:`STANDALONE_KINDS` (on the standalone cluster of two workers of
tests/clusters.py, whose ``StandaloneCluster`` the injector is given), and the workload it hits (``ddp``, or
``elastic``: the same run with ``min_processes=1``; ``transform``: the same run with a transform worker a rank,
for :data:`TRANSFORM_KINDS`; ``sharded``: FSDP2 with sharded keep-best checkpoints, for :data:`SHARDED_KINDS`).
A fault waits for its target's beacon and rank 0's step (tests/chaos/workload.py), acts, and records when it
acted; a run that ended first leaves it unfired. Each kind also says which ending the docs promise for it
(:class:`Ending`).

The standalone kinds, and what they do to the cluster:

- ``kill_executor``: SIGKILL to the executor JVM under the target rank (the ``java`` process running
  ``CoarseGrainedExecutorBackend`` above the rank's Python worker); the standalone master starts a replacement
  on the same worker, so the cluster comes back to its size by itself. With a ``hold`` (the elastic workload's
  draws) the worker is also stopped (SIGSTOP) for that long from just before the kill, so that the replacement
  comes only after the retry started on the slot left (a machine away for a while): an elastic run shrinks, then
  grows back. Without one, a replacement executor that registers within the retry's wait for the failed
  attempt's tasks (seconds) gives the retry its full size, and the elastic run never resizes;
- ``decommission_worker``: SIGPWR to the standalone worker under the target rank, what
  ``sbin/decommission-worker.sh`` sends (as tests/spark/test_elastic_runs.py and test_lanes_runs.py do); once
  its executor has exited (after the run left it) the worker is replaced by a new one
  (``StandaloneCluster.replace_worker``: the machine coming back, forked without Python code in
  the child, which would break this driver's py4j connections), so the next run finds the cluster whole. Just
  before the signal, it tells the ranks to hold their training until they heard the notice (the workload's
  ``hold-for-notice``, up to :data:`NOTICE_S`): the notice then always lands mid-training, however short the run.

The two-host kinds (:data:`HOST_KINDS`, :data:`ELASTIC_HOST_KINDS`; root only), on the cluster of
tests/two_hosts.py whose ``TwoHostCluster`` the injector is given, hit the host the target rank runs on:

- ``blip_link``: its link down for ``hold`` seconds, then up again (a switch port that flapped);
- ``freeze_host``: every process in its namespace (worker and executor JVMs, Python workers, ranks) stopped
  (SIGSTOP) for ``hold`` seconds, then continued: a gray failure, a machine that stalls without failing;
- ``cut_link``: its link down until the run ended (then up again, as an operator brings a host back, so that the
  next run finds the cluster whole): a host lost for good.
"""
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil

from chaos.workload import HOLD_FOR_NOTICE, STEPS

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class Ending:
    """What the docs promise once the fault fired: ``error`` None for a success with the weights of a fault-free
    run, else the error's class name, with the rank it must name (None: any) and the class of the rank's own
    exception (``cause``); ``rerun``: the same run_id run again then succeeds with the fault-free weights;
    ``may_succeed``: the fault may hit nothing the run still needs (a disk filled after the last save, a
    damaged checkpoint with a whole one before it), and then the run succeeds with the same weights;
    ``not_lost``: the fault costs no attempt (a host silent for less than spark.dist.hostLostTimeout is not lost):
    the run succeeds at attempt 0;
    ``preempted``: a run that needed more than one attempt went on after a preemption notice (a ``"preempted"``
    event in the driver's history), not by a retry (docs/elastic.md: such a restart is no retry);
    ``names_lost_rank``: the attempt the fault failed names the target rank as it is retried (docs/how_a_run_works.md:
    a lost Spark task names its rank; the driver's warning "attempt 0 of run ... failed (rank N on host ...)")."""
    error: Optional[str] = None
    rank_named: Optional[int] = None
    rerun: bool = False
    cause: Optional[str] = None
    may_succeed: bool = False
    preempted: bool = False
    names_lost_rank: bool = False
    not_lost: bool = False


@dataclass
class Fault:
    kind: str
    rank: int
    at: float  # when: after this fraction of the first attempt's training steps
    hold: float = 0.0  # SIGSTOP: seconds before SIGCONT (the rank's; for kill_executor, its worker's)
    # or "elastic" (the same workload with min_processes=1), "transform" (workers=1), "sharded" (FSDP2 keep-best),
    # "tune" (a study; the fault hits its trial number ``trial``), "connect" (the DDP one through Spark Connect),
    # "estimator" (a TorchEstimator fit, then its model's transform), "horovodrunner" (a Horovod program)
    workload: str = "ddp"
    trial: int = 0
    steps: int = STEPS  # a rank's training steps in the run (the campaign's workload length)
    delay: float = 0.0  # about when ``at`` comes, in seconds after the rank started (for the run's bounds)
    fired_at: Optional[float] = None
    host: Optional[str] = None  # a fault of the target's whole host (the two-host kinds): that host, once fired
    note: str = ""
    problems: list = field(default_factory=list)  # what the fault itself found broken (a violation each)
    _stopped: list = field(default_factory=list, repr=False)

    def describe(self) -> str:
        workload = "" if self.workload == "ddp" else f"{self.workload} "
        trial = f"trial {self.trial} " if self.workload == "tune" else ""
        return (f"{workload}{self.kind}({trial}rank {self.rank}, after step {self.step} of {self.steps}"
                f"{f', hold {self.hold:.1f}s' if self.hold else ''})")

    @property
    def label(self) -> str:
        """The kind, with the workload where it is not the plain DDP one (``elastic/kill_executor``)."""
        return self.kind if self.workload == "ddp" else f"{self.workload}/{self.kind}"

    @property
    def step(self) -> int:
        """Rank 0's training step after which the fault acts."""
        return max(1, round(self.at * self.steps))

    def ending(self) -> Ending:
        return ENDINGS[self.kind](self)


def _lost(f: "Fault") -> Ending:
    """A lost rank (or its Python worker): retried (max_retries), a success; under HorovodRunner, which has no
    retries (as Databricks'), a TrainingFailedError naming the rank."""
    return Ending(error="TrainingFailedError", rank_named=f.rank) if f.workload == "horovodrunner" else Ending()


ENDINGS = {
    "kill_rank": _lost,
    "stop_rank": lambda f: Ending(),
    "freeze_rank": lambda f: Ending(error="RunTimeoutError", rank_named=f.rank),
    "kill_worker": _lost,
    # The rank raises a TransformError naming the worker, which fails the attempt; the retry resumes from the
    # checkpoint with new workers, and the transform's seeds replay (docs/data.md): a success.
    "kill_transform_worker": lambda f: Ending(),
    "delete_checkpoint": lambda f: Ending(),
    "truncate_checkpoint": lambda f: Ending(error="TrainingFailedError", cause="CheckpointReadError",
                                            may_succeed=True),
    "hostile_client": lambda f: Ending(),
    "interrupt_driver": lambda f: Ending(error="KeyboardInterrupt", rerun=True),
    "full_disk": lambda f: Ending(error="TrainingFailedError", cause="DiskFullError", may_succeed=True),
    # A lost executor is a retry (max_retries) once the master replaced it, from the last checkpoint
    # (docs/how_a_run_works.md, "Failures and retries"); an elastic run's retry starts on the slot left instead
    # and grows back (docs/elastic.md): a success either way.
    "kill_executor": lambda f: Ending(names_lost_rank=True),
    # A preemption notice: rank 0 stops at its next checkpoint, a new attempt goes on from it, no retry
    # (docs/elastic.md, "Preemption notices").
    "decommission_worker": lambda f: Ending(preempted=True),
    # A host silent for less than spark.dist.hostLostTimeout is not lost (docs/how_a_run_works.md, "Failures and
    # retries"): its TCP connections carry on once it is back, and the run ends as the fault-free one did.
    "blip_link": lambda f: Ending(not_lost=True),
    "freeze_host": lambda f: Ending(not_lost=True),
    # A host gone for good is named lost within spark.dist.hostLostTimeout, its rank first, and the elastic run
    # goes on on the slots left (docs/elastic.md, "What happens").
    "cut_link": lambda f: Ending(names_lost_rank=True),
}
STANDALONE_KINDS = ("kill_executor", "decommission_worker")  # need the standalone cluster (Injector's cluster)
TRANSFORM_KINDS = ("kill_transform_worker",)  # need the transform workload's worker processes
# Need the two-host cluster (tests/two_hosts.py, root): against the ddp workload, and against the elastic one.
HOST_KINDS, ELASTIC_HOST_KINDS = ("blip_link", "freeze_host"), ("cut_link",)
# On any session of two slots (local[2]), against the ddp workload.
KINDS = tuple(k for k in ENDINGS if k not in STANDALONE_KINDS + TRANSFORM_KINDS + HOST_KINDS + ELASTIC_HOST_KINDS)
ELASTIC_KINDS = ("kill_executor",)  # the faults the elastic workload is run with
# The faults the sharded keep-best workload (tests/chaos/sharded_workload.py) is run with: those that stop a rank,
# its Python worker or the driver mid-run, and the hostile client; each ends in a success with the fault-free
# run's weights and best checkpoint.
SHARDED_KINDS = ("kill_rank", "stop_rank", "kill_worker", "interrupt_driver", "hostile_client")
# The faults a tuning study's trial (tests/chaos/tune_workload.py) is run with: a rank killed or stopped, its
# lane's Python worker killed; the trial is retried on a new lane and the study ends as the fault-free one did.
TUNE_KINDS = ("kill_rank", "stop_rank", "kill_worker")
# The faults a TorchEstimator fit with maxRetries and a transform worker a rank (tests/chaos/estimator_workload.py)
# is run with; it goes on from its last epoch to the fault-free fit's model and predictions.
ESTIMATOR_KINDS = ("kill_rank", "kill_worker", "kill_transform_worker")
# The faults a HorovodRunner program (tests/chaos/horovod_workload.py) is run with: a rank stopped for a moment
# (a success), a rank or its Python worker lost (a TrainingFailedError naming it: HorovodRunner has no retries).
HOROVOD_KINDS = ("kill_rank", "stop_rank", "kill_worker")
# The faults the DDP workload is run with through a Spark Connect client (Spark 4 line; the "connect" workload): a
# rank or its Python worker killed (retried), the client interrupted (the same run_id run again resumes).
CONNECT_KINDS = ("kill_rank", "kill_worker", "interrupt_driver")
ROOT_ONLY = ("full_disk",)  # a small tmpfs under the checkpoint directory needs a mount
EXECUTOR_EXIT_S = 60.0  # a decommissioned executor exits this soon after the run left it (else: a violation)
# A rank on a host cut off is stopped by its own supervisor within twice spark.dist.hostLostTimeout (10 s) of its
# last beat that reached the driver, a beat before the cut at most; and a look of the fence.
FENCED_WITHIN_S = 2 * 10.0 + 3.0
NOTICE_S = 30.0  # the ranks hold their training this long at most for a decommission's notice (within seconds)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def executor_of(target: dict) -> Optional[psutil.Process]:
    """The executor JVM above the rank of beacon ``target`` (an ancestor of its Python worker: the ``java``
    process whose command line holds ``CoarseGrainedExecutorBackend``); None when the rank and its worker are
    gone, or run in no executor (local mode)."""
    for pid in (target["pid"], target["ppid"]):
        try:
            parents = psutil.Process(pid).parents()
        except psutil.Error:
            continue
        for p in parents:
            try:
                cmdline = p.cmdline()
            except psutil.Error:
                continue
            if cmdline and os.path.basename(cmdline[0]) == "java" \
                    and "CoarseGrainedExecutorBackend" in " ".join(cmdline):
                return p
    return None


def worker_of(cluster, executor: int) -> Optional[int]:
    """The index of ``cluster``'s standalone worker that runs the executor JVM ``executor``."""
    return next((i for i in range(len(cluster.workers)) if executor in cluster.executor_pids(worker=i)), None)


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
    """Fires ``fault`` into the run whose ranks write to ``beacons``, its checkpoints in ``run_dir``; ``cluster``:
    the ``StandaloneCluster`` the run's session runs on (the standalone kinds need it)."""

    def __init__(self, fault: Fault, beacons: str, run_dir: str, run_id: str, disk: Optional[str] = None,
                 cluster=None):
        super().__init__(daemon=True, name=f"chaos-{fault.kind}")
        self.fault, self.beacons, self.run_dir, self.run_id, self.disk = fault, beacons, run_dir, run_id, disk
        self.cluster = cluster
        if fault.kind in STANDALONE_KINDS and cluster is None:
            raise ValueError(f"{fault.kind} needs the standalone cluster its run runs on")
        if fault.kind in HOST_KINDS + ELASTIC_HOST_KINDS and not hasattr(cluster, "take_down"):
            raise ValueError(f"{fault.kind} needs the two-host cluster its run runs on (tests/two_hosts.py)")
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

    def _kill_transform_worker(self, target):
        """SIGKILL to the target rank's transform worker (the interpreter it started, ``workers_main`` in its
        command line: data/read/transform_process.py)."""
        try:
            children = psutil.Process(target["pid"]).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                if "workers_main" in " ".join(child.cmdline()):
                    child.kill()
                    self._fired(f"transform worker {child.pid}")
                    return
            except psutil.Error:
                continue
        self.fault.problems.append(f"rank {self.fault.rank} had no transform worker process after step "
                                   f"{self.fault.step} (the transform workload runs one a rank)")

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
        # A real SIGINT, as Ctrl-C (or a notebook's interrupt) sends: it wakes a main thread blocked in a wait,
        # which _thread.interrupt_main() does not (that only marks the main thread, which a run under Spark
        # Connect, waiting for its job, noticed only once the run had ended).
        os.kill(os.getpid(), signal.SIGINT)
        self._fired()

    def _full_disk(self, target):
        filler = os.path.join(self.disk, "filler")
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        self._fired(f"{self.disk} filled")

    def _kill_executor(self, target):
        executor = executor_of(target)
        if executor is None:
            return
        worker = worker_of(self.cluster, executor.pid) if self.fault.hold else None
        held = worker is not None and self._signal(self.cluster.worker_pids[worker], signal.SIGSTOP)
        try:
            try:
                executor.kill()
            except psutil.NoSuchProcess:
                return
            self._fired(f"executor JVM {executor.pid}" + (f", worker {worker} held {self.fault.hold:.1f}s" if held
                                                          else ""))
            if held:
                time.sleep(self.fault.hold)
        finally:
            if held:
                self._signal(self.cluster.worker_pids[worker], signal.SIGCONT)

    def _decommission_worker(self, target):
        """SIGPWR to the worker under the target rank; then, once its executor has exited (the run left it), a
        new worker in its place. Both happen whether or not the run is still on: a fixed-size run waits for the
        new worker's executor to go on at its size, and the next run needs the cluster whole."""
        executor = executor_of(target)
        worker = None if executor is None else worker_of(self.cluster, executor.pid)
        if worker is None:
            return
        hold = os.path.join(self.beacons, HOLD_FOR_NOTICE)
        with open(hold + ".tmp", "w") as f:
            f.write(repr(time.time() + NOTICE_S))
        os.replace(hold + ".tmp", hold)
        os.kill(self.cluster.worker_pids[worker], signal.SIGPWR)  # what sbin/decommission-worker.sh sends
        self._fired(f"worker {worker} (executor JVM {executor.pid})")
        try:
            executor.wait(timeout=EXECUTOR_EXIT_S)
            self.fault.note += f", its executor gone {time.time() - self.fault.fired_at:.1f}s later"
        except psutil.TimeoutExpired:
            self.fault.problems.append(
                f"the decommissioned worker's executor {executor.pid} was still running {EXECUTOR_EXIT_S:.0f}s "
                "after the notice (docs/elastic.md: it exits once the run has checkpointed and left it)")
        started = time.monotonic()
        # Kills what is left of the old worker; the replacement must come. Forked without Python in the child: this
        # process is the run's driver (see StandaloneCluster._spawn).
        self.cluster.replace_worker(worker)
        self.fault.note += f", a new worker in {time.monotonic() - started:.1f}s"

    def _host(self, target) -> int:
        """The index of the two-host cluster's host the target rank runs on."""
        return self.cluster.hosts.index(target["host"])

    def _blip_link(self, target):
        host = self._host(target)
        self.cluster.take_down(host)
        try:
            self._fired(f"host {target['host']} off the network")
            time.sleep(self.fault.hold)
        finally:
            self.cluster.bring_up(host)

    def _freeze_host(self, target):
        stopped = [pid for pid in self.cluster.host_pids(self._host(target)) if self._signal(pid, signal.SIGSTOP)]
        try:
            self._fired(f"{len(stopped)} processes of host {target['host']}")
            time.sleep(self.fault.hold)
        finally:
            for pid in stopped:
                self._signal(pid, signal.SIGCONT)

    def _cut_link(self, target):
        """The target's host off the network until the run ended, and until the target rank is gone: cut off, it
        can learn of no abort, so its own supervisor must stop it (spark_dist/task/fence.py) within
        :data:`FENCED_WITHIN_S` of the cut; then back on the network."""
        host = self._host(target)
        self.cluster.take_down(host)
        try:
            self.fault.host = target["host"]
            self._fired(f"host {target['host']} off the network until the run ended")
            gone_at = None
            deadline = self.fault.fired_at + FENCED_WITHIN_S
            while not (self.done.is_set() and (gone_at is not None or time.time() > deadline)):
                if gone_at is None and not alive(target["pid"]):
                    gone_at = time.time()
                time.sleep(0.2)
            if gone_at is None or gone_at - self.fault.fired_at > FENCED_WITHIN_S:
                self.fault.problems.append(
                    f"rank {self.fault.rank} (pid {target['pid']}) on the host cut off still ran "
                    f"{FENCED_WITHIN_S:.0f}s after the cut: its supervisor did not stop it in time"
                    + ("" if gone_at is None else f" (it ended {gone_at - self.fault.fired_at:.1f}s after)"))
            else:
                self.fault.note += f", the cut-off rank stopped {gone_at - self.fault.fired_at:.1f}s after the cut"
        finally:
            self.cluster.bring_up(host)

    def finish(self) -> None:
        """The run ended: stop what is still acting (the hostile client), wake a waiting injector; a decommission
        still under way (its executor exiting, the new worker starting) is waited for."""
        self.done.set()
        if self.hostile is not None and self.hostile.is_alive():
            self.hostile.stop.set()
            self.hostile.join(10)
        self.join(EXECUTOR_EXIT_S + 150 if self.fault.kind == "decommission_worker" else 30)
        if self.is_alive():
            self.fault.problems.append(f"the {self.fault.kind} fault was still acting after the run ended")
