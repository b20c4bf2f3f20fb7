"""spark_dist.tune.trial_run without a JVM: stopping a trial reaches every attempt its run started, restarts
after a preemption and elastic resizes included, and starts no attempt after it. Attempts are stand-ins."""
import contextlib

import pytest

from spark_dist.config import RunConfig
from spark_dist.driver import distributor
from spark_dist.driver.outcome import Outcome
from spark_dist.errors import RankFailure
from spark_dist.spark import session
from spark_dist.tune.trial_run import Stopped, TrialRun

PREEMPTED = RankFailure(0, "h", "resized", "preempted: executor 1 on h being decommissioned")


class Trial:
    number = 7


def test_stop_cancels_every_attempt_started_past_max_retries_and_starts_no_more(monkeypatch, tmp_path):
    cancelled, ran = [], []
    run = TrialRun(Trial(), None, num_processes=2, max_retries=1, verbose=False)

    class Preempted:
        """Each attempt ends preempted (not a retry); the fifth is where the study is interrupted."""

        def __init__(self, owner, sized, backend, job_bytes, attempt, *args):
            self.attempt = attempt

        def run(self):
            ran.append(self.attempt)
            if self.attempt == 4:
                run.stop(object())  # from the study's thread, while attempt 4's job runs
            return Outcome(failures=[PREEMPTED])

    monkeypatch.setattr(distributor, "Attempt", Preempted)
    monkeypatch.setattr(distributor.Distributor, "_slots", lambda self, *args: contextlib.nullcontext(0.0))
    monkeypatch.setattr(distributor.Distributor, "_wait_to_retry", lambda self, *args: None)
    monkeypatch.setattr(session, "cancel", lambda spark, tag: cancelled.append(tag))
    config = RunConfig.build(num_processes=2, max_retries=1, run_id="trial7")
    run.last_run_id = config.run_id
    with pytest.raises(Stopped, match="trial 7: the study was interrupted"):
        run._attempts(config, object(), None, b"", {}, str(tmp_path), 2)
    assert ran == [0, 1, 2, 3, 4]  # no attempt 5 after the stop
    assert sorted(cancelled) == [f"spark_dist-trial7-{attempt}" for attempt in range(5)]


def test_stop_before_any_attempt_cancels_nothing_and_local_mode_cancels_no_job(monkeypatch):
    cancelled = []
    monkeypatch.setattr(session, "cancel", lambda spark, tag: cancelled.append(tag))
    TrialRun(Trial(), None, num_processes=2, verbose=False).stop(object())
    local = TrialRun(Trial(), None, num_processes=2, local_mode=True, verbose=False)
    local._attempt_started(RunConfig.build(num_processes=2, local_mode=True, run_id="l"), 0, 2, 0, [])
    local.stop(object())
    assert cancelled == []
    with pytest.raises(Stopped):  # its next attempt never starts
        local._attempt_started(RunConfig.build(num_processes=2, local_mode=True, run_id="l"), 1, 2, 2, [])


def sleep_without_a_report():
    import time

    time.sleep(120)


def test_a_local_mode_trial_stops_at_once_though_its_ranks_never_report():
    import threading
    import time

    run = TrialRun(Trial(), None, num_processes=1, local_mode=True, verbose=False)
    threading.Timer(3.0, run.stop, args=(None,)).start()  # the study's Ctrl-C, from another thread
    started = time.monotonic()
    with pytest.raises(Stopped, match="trial 7"):
        run.run(sleep_without_a_report)
    assert time.monotonic() - started < 30  # not the rank's 120 s


def test_a_retry_going_over_its_epochs_again_reports_each_at_its_own_step_once():
    # The chaos campaign's tune workload: attempt 0 reported epochs 0 and 1, died in epoch 2; the retry, from its
    # checkpoint at epoch 1's end, reports epoch 1 again (the same value), then 2. The pruner must see each epoch
    # at its own step: not epoch 1's value again at step 2, and epoch 2's at step 3.
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    run = TrialRun(trial, "score", num_processes=2, verbose=False)
    for attempt, epoch, score in [(0, 0, 1.0), (0, 1, 2.0), (1, 1, 2.0), (1, 2, 3.0)]:
        run._on_report({"rank": 0, "attempt": attempt, "time": 0.0, "epoch": epoch, "score": score})
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {0: 1.0, 1: 2.0, 2: 3.0}
    assert run.last_value == 3.0
