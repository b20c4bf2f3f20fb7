"""The campaign's workloads that the driver drives run after run (tests/chaos/campaign.py): a tuning study of
two-rank trials on lanes (tests/chaos/tune_workload.py), the fault in one trial, and a ``TorchEstimator`` fit on
JPEG bytes with ``maxRetries``, then its model's transform and a ``predict_batch_udf``
(tests/chaos/estimator_workload.py). Their invariants: each ends within its bound as the fault-free one did (each
trial's parameters, state and values; the fit's weights, history and both ways' predictions), no rank left, no
Spark job left running (a lane of the study)."""
import os
import tempfile
import time
from typing import Optional

from chaos import estimator_workload, invariants, tune_workload
from chaos.faults import Fault, Injector
from chaos.run_record import RunRecord, training_span
from chaos.workload import RANKS

MAX_RETRIES = 2  # as every workload of the campaign's


def study(campaign, root: str, ck_root: Optional[str] = None, timeout: Optional[float] = None):
    """A study of the tune workload, its trials' beacons under ``root``: ``(study, error)``."""
    from spark_dist.tune import optimize

    made = tune_workload.study()
    try:
        optimize(made, tune_workload.objective_for(root, campaign.epochs, campaign.step_s), tune_workload.TRIALS,
                 num_processes=RANKS, metric=tune_workload.METRIC, max_concurrent=1, max_retries=MAX_RETRIES,
                 run_timeout=timeout, checkpoint_dir=ck_root, datasets={"train": campaign.df})
    except BaseException as exc:  # noqa: BLE001 -- the ending under test
        return made, exc
    return made, None


def fit(campaign, beacons: str):
    """A fit of the estimator workload, its beacons in ``beacons``: ``(estimator_workload.fitted(...), error)``."""
    try:
        df = campaign.images()
        model = estimator_workload.estimator(beacons, campaign.epochs, campaign.step_s).fit(df)
        return estimator_workload.fitted(model, df), None
    except BaseException as exc:  # noqa: BLE001 -- the ending under test
        return None, exc


def fault_free(campaign, name: str):
    """The fault-free study (``name`` "tune") or fit ("estimator"): what it decided, its wall time, and the
    training time of its (first) run."""
    root = tempfile.mkdtemp(dir=campaign.root)
    started = time.monotonic()
    if name == "tune":
        got_study, error = study(campaign, root)
        got, spanned = tune_workload.outcome(got_study), tune_workload.trial_beacons(root, 0)
    else:
        (got, error), spanned = fit(campaign, root), root
    if error is not None:
        raise error
    return got, time.monotonic() - started, training_span(spanned)


def run(campaign, index: int, fault: Fault) -> RunRecord:
    """A study of the tune workload with ``fault`` in its trial ``fault.trial``, or a fit (and transform) of
    the estimator workload with ``fault`` in it. Its invariants: it ends within its bound as the fault-free
    one did (each trial's parameters, state and values; the fit's weights, history and predictions), no
    rank left, no Spark job left running (a lane of the study)."""
    expected, _, span = campaign.baseline(fault)
    fault.steps = campaign.steps
    fault.delay = round(fault.at * span, 2)  # into the target's training (a trial's starts after the others')
    root = tempfile.mkdtemp(dir=campaign.root)
    ck_root = os.path.join(campaign.root, f"ck-{index}")
    os.makedirs(ck_root, mode=0o700)
    target = tune_workload.trial_beacons(root, fault.trial) if fault.workload == "tune" else root
    os.makedirs(target, exist_ok=True)
    injector = Injector(fault, target, ck_root, "", None, campaign.cluster)
    started = time.monotonic()
    injector.start()
    try:
        if fault.workload == "tune":
            got_study, error = study(campaign, root, ck_root, timeout=campaign.bound(fault))
        else:
            got, error = fit(campaign, root)
    finally:
        wall = time.monotonic() - started
        injector.finish()
    if fault.workload == "tune":
        got = tune_workload.outcome(got_study)
        states = sorted({t[1] for t in got})
        ending = "study: " + ", ".join(f"{sum(t[1] == s for t in got)} {s}" for s in states)
    attempts = [int(n[1:].split("-")[0]) for n in os.listdir(target) if n.startswith("a") and n.endswith(".json")]
    if fault.workload == "estimator":
        ending = f"success (attempt {max(attempts, default=0)})"
    record = RunRecord(index, fault, type(error).__name__ if error is not None else ending, round(wall, 2),
                       round(campaign.bound(fault), 1), invariants.recovery(target, fault, max(attempts, default=0)))
    if wall > campaign.bound(fault):
        record.violations.append(f"took {wall:.1f}s, over its bound of {campaign.bound(fault):.1f}s")
    if error is not None:
        record.violations.append(f"it ended with {type(error).__name__}: {str(error)[:300]}"
                                 f"{invariants.raised_at(error)}")
    elif fault.workload == "tune":
        record.violations += tune_workload.same_study(got, expected)
    else:
        record.violations += estimator_workload.same_fit(got, expected)
    for beacons in {target, *(os.path.join(root, n) for n in os.listdir(root) if n.startswith("t"))}:
        record.violations += invariants.no_rank_left(beacons, fault)
    record.violations += invariants.no_job_left(campaign.spark)
    record.violations += fault.problems
    return campaign.kept(record)
