"""The fault campaign: a seeded schedule of faults (tests/chaos/faults.py), each injected into a run of the
workload (tests/chaos/workload.py), and the invariants checked after every run:

- it ends within a bound derived from its settings: a success, or the error the docs promise for the fault,
  naming the rank it hit;
- a success holds the weights of a fault-free run, bit for bit, and every epoch of its lineage trained every
  row exactly once; an elastic run that went on below its size is held to its rows only (a step on fewer ranks
  averages fewer rows: docs/elastic.md promises every row once across a resize, not the same weights);
- a fault whose ending is a preemption (``Ending.preempted``) went on in a new attempt after the notice, none of
  its attempts a retry; an attempt failed by a lost executor (``Ending.names_lost_rank``) is told on the driver
  naming the rank that ran there;
- the run's committed checkpoint is readable;
- no rank process outlives its run; the next run gets the cluster at full size (the next run is the check; the
  campaign ends with a fault-free one). On a standalone cluster it is also checked after each run: its master
  and workers run, and the driver counts every worker's task slots again within :data:`FULL_SIZE_S`;
- the driver's RSS grows by less than :data:`RSS_GROWTH_BOUND` over the whole campaign.

A campaign runs on any session of two slots (``local[2]`` in the suite, with :data:`faults.KINDS`), or on the
standalone cluster of two workers of tests/clusters.py (``cluster=`` its ``StandaloneCluster``), where it can also
run :data:`faults.STANDALONE_KINDS` and the ``elastic`` workload (``min_processes=1``), or on the two-host cluster
of tests/two_hosts.py (``cluster=`` its ``TwoHostCluster``, root only), where it can also run the host faults
(:data:`faults.HOST_KINDS`, and :data:`faults.ELASTIC_HOST_KINDS` against the elastic workload). A violation names
the seed and the fault that reproduce it. Used by tests/chaos/test_campaign.py (a fixed seed, in the suite, on
each) and bench/bench_chaos.py (``make soak``: any seed, any length, on ``local[2]`` or with ``--cluster
standalone`` or ``two_hosts``; figures for BENCHMARKS.md).
"""
import logging
import os
import random
import signal
import subprocess
import tempfile
import time
from typing import List, Optional

import psutil

from chaos import (driving, estimator_workload, faults, horovod_workload, invariants, sharded_workload, tune_workload,
                   workload)
from chaos.faults import Fault, Injector
from chaos.run_record import RunRecord, training_span

RSS_GROWTH_BOUND = 256 << 20
RANKS, MAX_RETRIES = workload.RANKS, driving.MAX_RETRIES
FULL_SIZE_S = 120.0  # after a run on a standalone cluster, its task slots are all back within this
# A run's extra allowance where its fault takes a JVM away: the master's replacement executor to start (a fixed-size
# retry waits for it), and for a decommission the executor to exit and a new worker and its executor to start.
CLUSTER_S = {"kill_executor": 60.0, "decommission_worker": 120.0,
             "cut_link": 10.0}  # a host lost for good: spark.dist.hostLostTimeout to name it


def schedule(seed: int, count: int, kinds=faults.KINDS, each_once: bool = False,
             elastic_kinds=(), transform_kinds=(), sharded_kinds=(), tune_kinds=(),
             estimator_kinds=(), horovod_kinds=()) -> List[Fault]:
    """``count`` faults drawn from ``seed``: kind and workload (each of ``kinds`` against the ``ddp`` workload,
    each of ``elastic_kinds`` against the ``elastic`` one, each of ``transform_kinds`` against the ``transform``
    one, each of ``sharded_kinds`` against the ``sharded`` one, each of ``tune_kinds`` against a trial of the
    ``tune`` one, each of ``estimator_kinds`` against the ``estimator`` one, each of ``horovod_kinds`` against
    the ``horovodrunner`` one; ``each_once``: every one of them
    once, in a drawn order, ``count`` ignored), target rank, when (a fraction of the training time after the
    target started),
    and for a SIGSTOP that is continued, how long it holds: a stopped rank's, or, for the elastic workload's
    killed executor, its worker's (long enough that the retry starts on the slot left before the replacement
    comes: the retry waits for the failed attempt's tasks to end and the slot count to stand still for 2 s).
    Without the ``*_kinds`` of the other workloads a seed draws what it always drew."""
    rng = random.Random(seed)
    draws = ([("ddp", kind) for kind in kinds] + [("elastic", kind) for kind in elastic_kinds]
             + [("transform", kind) for kind in transform_kinds] + [("sharded", kind) for kind in sharded_kinds]
             + [("tune", kind) for kind in tune_kinds] + [("estimator", kind) for kind in estimator_kinds]
             + [("horovodrunner", kind) for kind in horovod_kinds])
    order = rng.sample(draws, len(draws)) if each_once else [rng.choice(draws) for _ in range(count)]
    drawn = []
    for workload_name, kind in order:
        rank, at = rng.randrange(RANKS), round(rng.uniform(0.05, 0.8), 2)
        hold = 0.0
        if kind == "stop_rank":
            hold = round(rng.uniform(0.5, 3.0), 1)
        elif kind in faults.HOST_KINDS:  # well inside spark.dist.hostLostTimeout (10 s), TCP's back-off included
            hold = round(rng.uniform(1.0, 3.0), 1)
        elif workload_name == "elastic" and kind == "kill_executor":
            hold = round(rng.uniform(5.0, 8.0), 1)
        trial = rng.randrange(tune_workload.TRIALS) if workload_name == "tune" else 0
        drawn.append(Fault(kind, rank=rank, at=at, hold=hold, workload=workload_name, trial=trial))
    return drawn


class Campaign:
    """Runs faults against the workload on ``spark`` (``local[2]``, or any session with 2 slots; ``cluster``: the
    ``StandaloneCluster`` it runs on, for the standalone kinds), under ``root`` (a scratch directory the campaign
    owns). ``epochs`` and ``step_s``: the workload's length (tests/chaos/workload.py). ``warm_up``: first
    fault-free runs that only warm the session's Python workers (torch imported), one a task slot of the whole
    cluster (two runs on the two-host cluster's 4 slots), so that the next, which the faults are measured
    against, times a warm run; without them (a short campaign) that one run is both, and its time, a little
    longer, only loosens the bounds."""

    def __init__(self, spark, root: str, seed: int, cluster=None, epochs: int = workload.EPOCHS,
                 step_s: float = workload.STEP_S, warm_up: bool = True):
        self.spark, self.root, self.seed, self.cluster = spark, root, seed, cluster
        self.epochs, self.step_s, self.steps = epochs, step_s, workload.steps(epochs)
        self.df = workload.dataset(spark)
        self._images = None  # the estimator workload's rows, made by its first run
        self.records: List[RunRecord] = []
        # The session's first runs warm its Python workers, one a task slot (a run takes 2 of them): they time
        # nothing.
        for _ in range(self._slots() // RANKS if warm_up else 0):
            self._fault_free()
        self.expected, self.base, self.span = self._fault_free()
        self.baselines = {}  # the sharded and tune workloads' fault-free runs, each made before its first fault
        # After these runs the driver has imported what any run does (torch among it), once, which is no growth.
        self.rss_start = psutil.Process().memory_info().rss

    def images(self):
        """The estimator workload's rows (JPEG bytes), made once."""
        if self._images is None:
            self._images = estimator_workload.images(self.spark)
        return self._images

    def _slots(self) -> int:
        """The task slots of the cluster the campaign runs on when it is whole (``RANKS`` on ``local[2]``)."""
        return RANKS if self.cluster is None else max(RANKS, len(self.cluster.workers) * self.cluster.cores)

    def _fault_free(self, name: str = "ddp"):
        """A run of workload ``name`` without faults (the sharded one's result with ``"best"``, its best
        checkpoint's weights): its result, wall time, and rank 0's training time (from its start to its last
        step), which places the faults."""
        beacons = tempfile.mkdtemp(dir=self.root)
        started = time.monotonic()
        d, call = self._runner(name, beacons, checkpoint_dir=tempfile.mkdtemp(dir=self.root)
                               if name == "sharded" else None)
        out = call()
        wall = time.monotonic() - started
        if name == "sharded":
            out["best"] = sharded_workload.best_weights(d.best_checkpoint)
        return out, wall, training_span(beacons)

    def _work(self, sharded: bool, beacons: str, workers: int) -> tuple:
        """The function a Distributor's run of the workload runs, and its arguments."""
        if sharded:
            return sharded_workload.train, beacons, self.epochs, self.step_s
        return workload.train, beacons, self.epochs, self.step_s, workers

    def _runner(self, name: str, beacons: str, workers: int = 0, **settings):
        """A run of workload ``name``: ``(its Distributor, a call that runs it)``; ``settings``: the Distributor's
        (a HorovodRunner takes none: np=2, as on Databricks)."""
        from spark_dist import Distributor, HorovodRunner

        if name == "horovodrunner":
            runner = HorovodRunner(np=RANKS)
            return runner, lambda: runner.run(horovod_workload.main, beacons=beacons, epochs=self.epochs,
                                              step_s=self.step_s)
        d = Distributor(num_processes=RANKS, verbose=False, log_ranks="none", **settings)
        return d, lambda: d.run(*self._work(name == "sharded", beacons, workers), datasets={"train": self.df})

    def baseline(self, fault: Fault):
        """``(result, wall time, training time)`` of the fault-free run ``fault``'s workload is held to (the tune
        workload's: the study's :func:`tune_workload.outcome`, the study's wall time, a trial's training time)."""
        if fault.workload not in ("sharded", "tune", "estimator", "horovodrunner"):
            return self.expected, self.base, self.span
        if fault.workload not in self.baselines:
            before = psutil.Process().memory_info().rss
            self.baselines[fault.workload] = (self._fault_free(fault.workload)
                                              if fault.workload in ("sharded", "horovodrunner")
                                              else driving.fault_free(self, fault.workload))
            # What its first run imports (FSDP and DCP, Optuna, Horovod) the driver keeps once: no growth of the
            # campaign's.
            self.rss_start += psutil.Process().memory_info().rss - before
        return self.baselines[fault.workload]

    def bound(self, fault: Fault) -> float:
        """How long a run with ``fault`` may take: every attempt as long as a fault-free run (one more where a
        preemption or a grow adds an attempt that is no retry), its fault's own delay and hold, the cluster's
        time to replace what the fault took (:data:`CLUSTER_S`), and a minute of slack for the machine (a frozen
        rank's run ends at its timeout)."""
        if fault.kind == "freeze_rank":
            return self.timeout(fault) + 30
        attempts = MAX_RETRIES + 1 + (fault.workload == "elastic" or fault.ending().preempted)
        return (self.baseline(fault)[1] * attempts * (2 if fault.ending().rerun else 1) + fault.delay + fault.hold + 60
                + CLUSTER_S.get(fault.kind, 0.0))

    def timeout(self, fault: Fault) -> float:
        """The run's ``timeout=``: a frozen rank must end it soon; any other hang ends at the bound."""
        return self.baseline(fault)[1] + fault.delay + 10 if fault.kind == "freeze_rank" else self.bound(fault)

    def run(self, index: int, fault: Fault) -> RunRecord:
        from spark_dist import Distributor

        if fault.kind in faults.STANDALONE_KINDS and self.cluster is None:
            raise ValueError(f"{fault.describe()} needs the standalone cluster: Campaign(..., cluster=)")
        if fault.kind in faults.HOST_KINDS + faults.ELASTIC_HOST_KINDS and not hasattr(self.cluster, "take_down"):
            raise ValueError(f"{fault.describe()} needs the two-host cluster: Campaign(..., cluster=TwoHostCluster)")
        if fault.workload in ("tune", "estimator"):
            return driving.run(self, index, fault)
        fault.steps = self.steps
        expected, _, span = self.baseline(fault)
        fault.delay = round(fault.at * span, 2)
        beacons = tempfile.mkdtemp(dir=self.root)
        ck_root, disk = self._checkpoint_root(index, fault)
        run_id = f"chaos-{self.seed}-{index}"
        run_dir = os.path.join(ck_root, run_id)
        workers = 1 if fault.workload == "transform" else 0
        d, call = self._runner(fault.workload, beacons, workers, max_retries=MAX_RETRIES, timeout=self.timeout(fault),
                               checkpoint_dir=ck_root, run_id=run_id,
                               min_processes=1 if fault.workload == "elastic" else None)
        injector = Injector(fault, beacons, run_dir, run_id, disk, self.cluster)
        work = self._work(fault.workload == "sharded", beacons, workers)
        out, error, started = None, None, time.monotonic()
        told = invariants.Told()  # what the driver logs as it retries: each failed attempt, named
        logging.getLogger("spark_dist").addHandler(told)
        # Ctrl-C reaches a user's Python, whose SIGINT raises KeyboardInterrupt; a process started in the
        # background by a script (this campaign under `make`, nohup) inherits SIGINT ignored.
        interrupts = signal.getsignal(signal.SIGINT)
        if fault.kind == "interrupt_driver":
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            injector.start()
            try:
                out = call()
            finally:
                first_wall = time.monotonic() - started
                injector.finish()
                logging.getLogger("spark_dist").removeHandler(told)
        except BaseException as exc:  # noqa: BLE001 -- the ending under test (KeyboardInterrupt included)
            error = exc
        finally:
            signal.signal(signal.SIGINT, interrupts)
        finished = d  # the Distributor whose run ended it (the rerun's, after an interrupted run)
        rerun_at = None
        if fault.ending().rerun and fault.fired_at is not None and not isinstance(error, KeyboardInterrupt):
            fault.problems.append(f"the driver was interrupted, but the run ended "
                                  f"{'as if it had not been' if error is None else type(error).__name__}: "
                                  "Ctrl-C must stop it (KeyboardInterrupt)")
        if fault.ending().rerun and isinstance(error, KeyboardInterrupt):
            rerun_at = time.time()
            try:  # the same run_id again: it resumes from the interrupted one's checkpoint
                finished = Distributor(num_processes=RANKS, max_retries=MAX_RETRIES, timeout=self.bound(fault),
                                       verbose=False, log_ranks="none", checkpoint_dir=ck_root, run_id=run_id)
                out = finished.run(*work, datasets={"train": self.df})
            except BaseException as exc:  # noqa: BLE001
                error = exc
            else:
                error = None
        wall = time.monotonic() - started
        events = [r for r in d.history if r.get("event")]
        record = RunRecord(index, fault, _ending(out, error), round(wall, 2), round(self.bound(fault), 1),
                           None if error is not None else invariants.recovery(beacons, fault, out["attempt"], rerun_at),
                           events=[f"{e['event']} to {e['world_size']} ranks at attempt {e['attempt']} "
                                   f"({e['reason']})" for e in events])
        record.violations += self._check(fault, out, error, wall, run_dir, beacons, events, expected)
        if error is None and fault.workload == "sharded":
            record.violations += invariants.kept_the_best(out, expected, finished.best_checkpoint, run_dir)
        record.violations += invariants.time_accounted(d.goodput_rows, first_wall)
        if fault.ending().names_lost_rank and fault.fired_at is not None:
            record.violations += invariants.named_the_lost_rank(fault, told.messages)
        record.violations += fault.problems
        self._release(fault, disk)
        return self.kept(record)

    def kept(self, record: RunRecord) -> RunRecord:
        """``record`` with what every run ends with: the cluster whole again (a standalone one), the driver's
        RSS; kept in the campaign's records."""
        record.whole_after, whole = self._whole_again()
        record.violations += whole
        record.rss_mib = round(psutil.Process().memory_info().rss / 2**20, 1)
        self.records.append(record)
        return record

    def _whole_again(self):
        """On a standalone cluster: ``(seconds until the driver counted all its task slots again, violations)``;
        its master and workers must still run (else the next run would find a smaller cluster, or none)."""
        if self.cluster is None:
            return None, []
        from spark_dist.spark import session

        if not self.cluster.is_running():
            return None, ["a JVM of the standalone cluster (its master or a worker) is gone after the run"]
        full = self._slots()  # every worker's executor back
        started = time.monotonic()
        while True:
            slots = session.task_slots(self.spark)
            waited = time.monotonic() - started
            if slots >= full:
                return round(waited, 2), []
            if waited > FULL_SIZE_S:
                return None, [f"the cluster had {slots} task slots {FULL_SIZE_S:.0f}s after the run, not {full}: "
                              "the next run would not get it at full size"]
            time.sleep(0.25)

    def _checkpoint_root(self, index: int, fault: Fault):
        path = os.path.join(self.root, f"ck-{index}")
        os.makedirs(path, mode=0o700)
        if fault.kind != "full_disk":
            return path, None
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", path], check=True)
        return path, path

    def _release(self, fault: Fault, disk: Optional[str]) -> None:
        for pid in fault._stopped:  # the product should have ended a frozen rank; never leave one behind
            invariants.kill(pid)
        if disk is not None:
            subprocess.run(["umount", disk], check=True)

    def _check(self, fault: Fault, out, error, wall: float, run_dir: str, beacons: str,
               events: List[dict], expected) -> List[str]:
        found = []
        promised = fault.ending()
        if wall > self.bound(fault):
            found.append(f"took {wall:.1f}s, over its bound of {self.bound(fault):.1f}s")
        if error is None:
            if fault.fired_at is not None and promised.error is not None and not promised.rerun \
                    and not promised.may_succeed:
                found.append(f"succeeded where the docs promise {promised.error}")
            shrunk = [e for e in events if e["world_size"] < RANKS]
            if fault.workload != "sharded":  # its own check: invariants.kept_the_best
                found += invariants.same_training(out, expected, self.epochs, weights=not shrunk)
            if promised.preempted and fault.fired_at is not None:
                found += invariants.went_on_after_a_preemption(out, events)
            if promised.not_lost and fault.fired_at is not None and out["attempt"] != 0:
                found.append(f"it took {out['attempt'] + 1} attempts where the docs promise none lost: a host silent "
                             "for less than spark.dist.hostLostTimeout is not lost")
        elif fault.fired_at is None or type(error).__name__ != (promised.error or ""):
            found.append(f"ended with {type(error).__name__}: {str(error)[:300]}{invariants.raised_at(error)}")
        else:
            found += invariants.names_what_it_should(fault, error, promised)
        found += invariants.checkpoint_readable(run_dir, fault)
        found += invariants.no_rank_left(beacons, fault)
        return found

    def finish(self) -> List[str]:
        """The campaign's own invariants, after its last run: a fault-free run at full size, the driver's RSS."""
        found = []
        found += [f"after the campaign: {v}" for v in self._whole_again()[1]]
        try:
            out, _, _ = self._fault_free()
            found += [f"the run after the campaign: {v}"
                      for v in invariants.same_training(out, self.expected, self.epochs)]
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
