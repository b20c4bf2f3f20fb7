"""The fault campaign: a seeded schedule of faults (tests/chaos/faults.py), each injected into a run of the
workload (tests/chaos/workload.py), and the invariants checked after every run:

- it ends within a bound derived from its settings: a success, or the error the docs promise for the fault,
  naming the rank it hit;
- a success holds the weights of a fault-free run, bit for bit, and every epoch of its lineage trained every
  row exactly once;
- the run's committed checkpoint is readable;
- no rank process outlives its run; the next run gets the cluster at full size (the next run is the check; the
  campaign ends with a fault-free one);
- the driver's RSS grows by less than :data:`RSS_GROWTH_BOUND` over the whole campaign.

A violation names the seed and the fault that reproduce it. Used by tests/chaos/test_campaign.py (a fixed seed,
in the suite) and tests/chaos/soak.py (``make soak``: any seed, any length, figures for BENCHMARKS.md).
"""
import json
import os
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional

import psutil

from chaos import faults, workload
from chaos.faults import Fault, Injector

RSS_GROWTH_BOUND = 256 << 20
RANKS, MAX_RETRIES = 2, 2


def schedule(seed: int, count: int, kinds=faults.KINDS, each_once: bool = False) -> List[Fault]:
    """``count`` faults drawn from ``seed``: kind (``each_once``: every kind of ``kinds`` once, in a drawn
    order, ``count`` ignored), target rank, when (a fraction of the training time after the target started),
    and for a SIGSTOP that is continued, how long it holds."""
    rng = random.Random(seed)
    order = rng.sample(list(kinds), len(kinds)) if each_once else [rng.choice(kinds) for _ in range(count)]
    drawn = []
    for kind in order:
        drawn.append(Fault(kind, rank=rng.randrange(RANKS), at=round(rng.uniform(0.05, 0.8), 2),
                           hold=round(rng.uniform(0.5, 3.0), 1) if kind == "stop_rank" else 0.0))
    return drawn


@dataclass
class RunRecord:
    index: int
    fault: Fault
    ending: str  # "success (attempt N)" or the error's class name
    wall: float
    bound: float
    recovery: Optional[float]  # seconds from the fault to the next training step, when there was one
    violations: List[str] = field(default_factory=list)
    rss_mib: float = 0.0  # the driver's resident memory after the run


class Campaign:
    """Runs faults against the workload on ``spark`` (``local[2]``, or any session with 2 slots), under ``root``
    (a scratch directory the campaign owns)."""

    def __init__(self, spark, root: str, seed: int):
        self.spark, self.root, self.seed = spark, root, seed
        self.df = workload.dataset(spark)
        self.records: List[RunRecord] = []
        self._fault_free()  # the session's first run warms its Python workers: it times nothing
        self.expected, self.base, self.span = self._fault_free()
        # After two runs: the driver has imported what any run does (torch among it), once, which is no growth.
        self.rss_start = psutil.Process().memory_info().rss

    def _fault_free(self):
        """A run without faults: its result, wall time, and rank 0's training time (from its start to its last
        step), which places the faults."""
        from spark_dist import Distributor

        beacons = tempfile.mkdtemp(dir=self.root)
        started = time.monotonic()
        out = Distributor(num_processes=RANKS, verbose=False, log_ranks="none").run(
            workload.train, beacons, datasets={"train": self.df})
        wall = time.monotonic() - started
        with open(os.path.join(beacons, "steps")) as f:
            last = max(float(line.split()[3]) for line in f if line.strip())
        return out, wall, last - faults.beacon(beacons, 0)["time"]

    def bound(self, fault: Fault) -> float:
        """How long a run with ``fault`` may take: every attempt as long as a fault-free run, its fault's own
        delay and hold, and a minute of slack for the machine (a frozen rank's run ends at its timeout)."""
        if fault.kind == "freeze_rank":
            return self.timeout(fault) + 30
        return self.base * (MAX_RETRIES + 1) * (2 if fault.ending().rerun else 1) + fault.delay + fault.hold + 60

    def timeout(self, fault: Fault) -> float:
        """The run's ``timeout=``: a frozen rank must end it soon; any other hang ends at the bound."""
        return self.base + fault.delay + 10 if fault.kind == "freeze_rank" else self.bound(fault)

    def run(self, index: int, fault: Fault) -> RunRecord:
        from spark_dist import Distributor

        fault.delay = round(fault.at * self.span, 2)
        beacons = tempfile.mkdtemp(dir=self.root)
        ck_root, disk = self._checkpoint_root(index, fault)
        run_id = f"chaos-{self.seed}-{index}"
        run_dir = os.path.join(ck_root, run_id)
        d = Distributor(num_processes=RANKS, max_retries=MAX_RETRIES, timeout=self.timeout(fault), verbose=False,
                        log_ranks="none", checkpoint_dir=ck_root, run_id=run_id)
        injector = Injector(fault, beacons, run_dir, run_id, disk)
        out, error, started = None, None, time.monotonic()
        try:
            injector.start()
            try:
                out = d.run(workload.train, beacons, datasets={"train": self.df})
            finally:
                injector.finish()
        except BaseException as exc:  # noqa: BLE001 -- the ending under test (KeyboardInterrupt included)
            error = exc
        if fault.ending().rerun and isinstance(error, KeyboardInterrupt):
            try:  # the same run_id again: it resumes from the interrupted one's checkpoint
                out = Distributor(num_processes=RANKS, max_retries=MAX_RETRIES, timeout=self.bound(fault),
                                  verbose=False, log_ranks="none", checkpoint_dir=ck_root, run_id=run_id).run(
                    workload.train, beacons, datasets={"train": self.df})
            except BaseException as exc:  # noqa: BLE001
                error = exc
            else:
                error = None
        wall = time.monotonic() - started
        record = RunRecord(index, fault, _ending(out, error), round(wall, 2), round(self.bound(fault), 1),
                           None if error is not None else _recovery(beacons, fault, out["attempt"]))
        record.violations += self._check(fault, out, error, wall, run_dir, beacons)
        self._release(fault, disk)
        record.rss_mib = round(psutil.Process().memory_info().rss / 2**20, 1)
        self.records.append(record)
        return record

    def _checkpoint_root(self, index: int, fault: Fault):
        path = os.path.join(self.root, f"ck-{index}")
        os.makedirs(path, mode=0o700)
        if fault.kind != "full_disk":
            return path, None
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", path], check=True)
        return path, path

    def _release(self, fault: Fault, disk: Optional[str]) -> None:
        for pid in fault._stopped:  # the product should have ended a frozen rank; never leave one behind
            _kill(pid)
        if disk is not None:
            subprocess.run(["umount", disk], check=True)

    def _check(self, fault: Fault, out, error, wall: float, run_dir: str, beacons: str) -> List[str]:
        found = []
        promised = fault.ending()
        if wall > self.bound(fault):
            found.append(f"took {wall:.1f}s, over its bound of {self.bound(fault):.1f}s")
        if error is None:
            if fault.fired_at is not None and promised.error is not None and not promised.rerun \
                    and not promised.may_succeed:
                found.append(f"succeeded where the docs promise {promised.error}")
            found += _same_training(out, self.expected)
        elif fault.fired_at is None or type(error).__name__ != (promised.error or ""):
            found.append(f"ended with {type(error).__name__}: {str(error)[:300]}")
        else:
            found += _names_what_it_should(fault, error, promised)
        found += _checkpoint_readable(run_dir, fault)
        found += _no_rank_left(beacons, fault)
        return found

    def finish(self) -> List[str]:
        """The campaign's own invariants, after its last run: a fault-free run at full size, the driver's RSS."""
        found = []
        try:
            out, _, _ = self._fault_free()
            found += [f"the run after the campaign: {v}" for v in _same_training(out, self.expected)]
        except Exception as exc:  # noqa: BLE001
            found.append(f"the run after the campaign failed: {type(exc).__name__}: {exc}")
        growth = psutil.Process().memory_info().rss - self.rss_start
        if growth > RSS_GROWTH_BOUND:
            found.append(f"the driver's RSS grew by {growth >> 20} MiB over the campaign")
        return found

    def violations(self) -> List[str]:
        return [f"seed {self.seed}, run {r.index}: {r.fault.describe()} ended {r.ending}: {v}"
                for r in self.records for v in r.violations]


def _ending(out, error) -> str:
    if error is not None:
        return type(error).__name__
    return f"success (attempt {out['attempt']})"


def _same_training(out, expected) -> List[str]:
    found = []
    for name, tensor in expected["weights"].items():
        if not tensor.equal(out["weights"][name]):
            found.append(f"weights {name} differ from the fault-free run's")
    for epoch in range(workload.EPOCHS):
        ids = sorted(out["lineage"].get(epoch, []))
        if ids != list(range(workload.ROWS)):
            found.append(f"epoch {epoch} trained {len(ids)} rows ({len(set(ids))} distinct), not each of "
                         f"{workload.ROWS} once")
    return found


def _names_what_it_should(fault: Fault, error, promised) -> List[str]:
    found = []
    if promised.rank_named is not None and getattr(error, "rank", None) != promised.rank_named:
        found.append(f"names rank {getattr(error, 'rank', None)}, not rank {promised.rank_named}: {error}")
    cause = getattr(error, "cause", None)
    if promised.cause is not None and type(cause).__name__ != promised.cause:
        found.append(f"its rank's error is {type(cause).__name__}, not {promised.cause}: {str(error)[:300]}")
    if fault.kind == "full_disk" and "disk full" not in str(error):
        found.append(f"a full disk is not told in words: {str(error)[:300]}")
    return found


def _checkpoint_readable(run_dir: str, fault: Fault) -> List[str]:
    path = os.path.join(run_dir, faults.CHECKPOINT_FILE)
    if not os.path.exists(path):
        return []
    import torch

    try:
        torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001
        if fault.kind != "truncate_checkpoint":  # the fault's own damage, when nothing saved after it
            return [f"its committed checkpoint {path} cannot be read: {type(exc).__name__}: {exc}"]
    return []


def _no_rank_left(beacons: str, fault: Fault) -> List[str]:
    found = []
    for name in os.listdir(beacons):
        if name.endswith(".json"):
            with open(os.path.join(beacons, name)) as f:
                pid = json.load(f)["pid"]
            if _alive(pid):
                found.append(f"rank process {pid} ({name}) outlived its run")
                _kill(pid)
    return found


def _recovery(beacons: str, fault: Fault, final_attempt: int) -> Optional[float]:
    """Seconds from the fault to training again: to the first step of the attempt that finished the run, when
    the fault cost an attempt; else to the second step rank 0 finished after it (the first may have been in
    flight when the fault hit)."""
    if fault.fired_at is None or not os.path.exists(os.path.join(beacons, "steps")):
        return None
    with open(os.path.join(beacons, "steps")) as f:
        steps = [(int(a), float(t)) for a, _, _, t in (line.split() for line in f if line.strip())]
    after = sorted(t for a, t in steps if t > fault.fired_at and (a == final_attempt or not final_attempt))
    needed = 0 if final_attempt else 1
    return round(after[needed] - fault.fired_at, 3) if len(after) > needed else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
