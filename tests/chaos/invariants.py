"""The invariants the fault campaign checks after a run (tests/chaos/campaign.py): what a success trained, what an
error names, that checkpoints stay readable, that no rank outlives its run, and when training went on again."""
import json
import logging
import os
import re
from typing import List, Optional

from chaos import faults, workload
from chaos.faults import Fault, alive


def same_training(out, expected, epochs: int, weights: bool = True) -> List[str]:
    """What a success must have trained: each of ``epochs`` every row once; ``weights``: the weights of the
    fault-free run ``expected``, bit for bit."""
    found = []
    for name, tensor in expected["weights"].items() if weights else ():
        if not tensor.equal(out["weights"][name]):
            found.append(f"weights {name} differ from the fault-free run's")
    for epoch in range(epochs):
        ids = sorted(out["lineage"].get(epoch, []))
        if ids != list(range(workload.ROWS)):
            found.append(f"epoch {epoch} trained {len(ids)} rows ({len(set(ids))} distinct), not each of "
                         f"{workload.ROWS} once")
    return found


def kept_the_best(out, expected, best: Optional[str], run_dir: str) -> List[str]:
    """The sharded keep-best workload's success: the fault-free run's final weights, and a ``best_checkpoint``
    whose weights are the fault-free run's best checkpoint's (``expected["best"]``); every committed checkpoint
    left in ``run_dir`` loads whole."""
    from spark_dist.task.sharded_checkpoints import committed

    from chaos import sharded_workload

    found = same_training(out, expected, 0)
    if best is None:
        return found + ["Distributor.best_checkpoint is None after a run that saved sharded checkpoints"]
    try:
        weights = sharded_workload.best_weights(best)
    except Exception as exc:  # noqa: BLE001
        return found + [f"its best checkpoint {best} cannot be read: {type(exc).__name__}: {exc}"]
    if any(not tensor.equal(weights[name]) for name, tensor in expected["best"].items()):
        kept = [(c.seq, c.score) for c in committed(run_dir)]
        found.append(f"its best checkpoint {best} holds other weights than the fault-free run's best (the "
                     f"committed checkpoints left, with their scores: {kept})")
    for c in committed(run_dir):
        try:
            sharded_workload.best_weights(c.path)
        except Exception as exc:  # noqa: BLE001
            found.append(f"its committed checkpoint {c.path} cannot be read: {type(exc).__name__}: {exc}")
    return found


def went_on_after_a_preemption(out, events: List[dict]) -> List[str]:
    """A run preempted mid-training went on in a new attempt, which is no retry: every attempt after the first
    has the driver's ``"preempted"`` (or, elastic, ``"resize"``) record. Its ranks held their training until they
    heard the notice (the workload's ``hold-for-notice``), and the workload checkpoints at its last step, so the
    first attempt always had a checkpoint left to stop at: a success there means the notice never came (within
    :data:`faults.NOTICE_S`), or rank 0 did not stop."""
    if not out["attempt"]:
        return [f"finished in its first attempt: the ranks did not hear the notice within {faults.NOTICE_S:.0f}s "
                "(ctx.preempted), or rank 0 did not stop at its next checkpoint"]
    found = []
    if not any(e["event"] == "preempted" for e in events):
        found.append(f"finished in attempt {out['attempt']} with no preemption in the driver's history: the "
                     "notice was not heard, and the run went on by a retry")
    retries = out["attempt"] - sum(1 for e in events if e["attempt"] > 0)
    if retries > 0:
        found.append(f"{retries} of its {out['attempt']} restarts were retries (a failed attempt), not restarts "
                     "after the notice")
    return found


def raised_at(error: BaseException) -> str:
    """Where in spark_dist an unexpected error came from (its innermost three frames there), to find the cause."""
    import traceback

    mark = f"{os.sep}spark_dist{os.sep}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if mark in f.filename][-3:]
    if not frames:
        return ""
    return " (raised in " + " < ".join(f"spark_dist/{f.filename.rsplit(mark, 1)[1]}:{f.lineno} {f.name}"
                                       for f in reversed(frames)) + ")"


class Told(logging.Handler):
    """The driver's log lines of one run (``spark_dist``'s logger: a retry's warning names the failed attempt)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def named_the_lost_rank(fault: Fault, messages: List[str]) -> List[str]:
    """The first attempt failed by the fault was told naming the target rank as it was retried (its warning leads
    with the first failure: "attempt 0 of run <id> failed (rank N on host ...)"); for a fault of a whole host
    (``fault.host``), naming that host, whichever of its ranks leads; nothing to check where the run never
    retried (it ended first)."""
    failed = [m for m in messages if re.search(r"attempt 0 of run \S+ failed \(", m)]
    if not failed:
        return []
    if fault.host is not None:
        if f" on host {fault.host}" in failed[0] and f"host {fault.host} went silent" in failed[0]:
            return []
        return [f"its failed attempt does not name host {fault.host}, which went off the network: {failed[0][:300]}"]
    named = re.search(r"failed \(rank (\d+) on host ", failed[0])
    if named is None or int(named.group(1)) != fault.rank:
        return [f"its failed attempt names {f'rank {named.group(1)}' if named else 'no rank'}, not rank {fault.rank} "
                f"whose executor was lost: {failed[0][:300]}"]
    return []


def names_what_it_should(fault: Fault, error, promised) -> List[str]:
    found = []
    if promised.rank_named is not None and getattr(error, "rank", None) != promised.rank_named:
        found.append(f"names rank {getattr(error, 'rank', None)}, not rank {promised.rank_named}: {error}")
    cause = getattr(error, "cause", None)
    if promised.cause is not None and type(cause).__name__ != promised.cause:
        found.append(f"its rank's error is {type(cause).__name__}, not {promised.cause}: {str(error)[:300]}")
    if fault.kind == "full_disk" and "disk full" not in str(error):
        found.append(f"a full disk is not told in words: {str(error)[:300]}")
    return found


def checkpoint_readable(run_dir: str, fault: Fault) -> List[str]:
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


def no_rank_left(beacons: str, fault: Fault) -> List[str]:
    found = []
    for name in os.listdir(beacons):
        if name.endswith(".json"):
            with open(os.path.join(beacons, name)) as f:
                pid = json.load(f)["pid"]
            if alive(pid):
                found.append(f"rank process {pid} ({name}) outlived its run")
                kill(pid)
    return found


def no_job_left(spark, within: float = 10.0) -> List[str]:
    """No Spark job of the session still runs ``within`` seconds after a study (its lanes end with it)."""
    import time

    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + within
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = tracker.getActiveJobsIds()
    return [f"Spark jobs {sorted(left)} still ran {within:.0f}s after the study ended (a lane left running)"] \
        if left else []


def recovery(beacons: str, fault: Fault, final_attempt: int, rerun_at: Optional[float] = None) -> Optional[float]:
    """Seconds from the fault to training again: after an interrupted driver, to the first step of the same
    ``run_id`` run again (``rerun_at``: when it was started, epoch seconds; its ranks are new processes); to the
    first step of the attempt that finished the run, when the fault cost an attempt (an elastic run's: of the
    first attempt after it, which may have run on fewer ranks before the run grew back); else to the second step
    rank 0 finished after it (the first may have been in flight when the fault hit)."""
    if fault.fired_at is None or not os.path.exists(os.path.join(beacons, "steps")):
        return None
    with open(os.path.join(beacons, "steps")) as f:  # attempt epoch step time pid (workload.stepped)
        steps = [(int(a), float(t), pid) for a, _, _, t, pid in (line.split() for line in f if line.strip())]
    if rerun_at is not None:
        # The interrupted run's ranks may take a last step or two after it raised (stopping them takes a moment):
        # they are no recovery. The run again's first step is the first of a rank process not seen before.
        before = {pid for _, t, pid in steps if t <= rerun_at}
        after = sorted(t for _, t, pid in steps if t > rerun_at and pid not in before)
        return round(after[0] - fault.fired_at, 3) if after else None
    later = (lambda a: a > 0) if fault.workload == "elastic" else (lambda a: a == final_attempt)
    after = sorted(t for a, t, _ in steps if t > fault.fired_at and (later(a) or not final_attempt))
    needed = 0 if final_attempt else 1
    return round(after[needed] - fault.fired_at, 3) if len(after) > needed else None


def kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def time_accounted(rows: List[dict], wall: float) -> List[str]:
    """The run's time split (``Distributor.goodput()``) adds up to its wall time within 2% (or 0.2 s: a short
    run's own edges), whatever the fault made of its attempts."""
    if not rows:
        return ["the run left no time split (Distributor.goodput() is empty)"]
    accounted = sum(r["wall"] for r in rows)
    if abs(accounted - wall) > max(0.02 * wall, 0.2):
        return [f"its time split adds up to {accounted:.2f}s of its {wall:.2f}s "
                f"({', '.join(r['ending'] for r in rows)})"]
    return []
