"""Lanes (spark_dist.driver.lanes) under a tuning study on real Spark: a trial whose lane's job is lost is retried
on a new lane; a run of this process that waits for slots gets them between two trials, not after the study.
(That trials share a lane's job and its warm workers: tests/spark/test_tune_runs.py.)"""
import os
import signal
import threading
import time

import pytest

from spark_dist import Distributor, get_context
from spark_dist.tune import optimize

optuna = pytest.importorskip("optuna")


def kill_own_worker_once(x, marker_dir):
    """The first attempt kills the Python worker its rank was forked from (the lane's task dies with it); a
    retry returns x."""
    marker = os.path.join(marker_dir, f"killed-{x}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    return float(x)


def test_a_trial_whose_lane_is_lost_is_retried_on_a_new_lane(spark_local, tmp_path):
    spark = spark_local
    study = optuna.create_study()
    study.enqueue_trial({"x": 7})
    optimize(study, lambda t: (kill_own_worker_once, (t.suggest_int("x", 0, 9), str(tmp_path))), 1,
             max_retries=1, max_concurrent=1)
    [trial] = study.trials
    assert (trial.state.name, trial.value) == ("COMPLETE", 7.0)
    # The retry ran on the study's second lane (its lanes are numbered as started): the first lane's job failed
    # with its lost task, the second's ended with the study, and none is left running.
    pool_id, number = trial.user_attrs["spark_dist_lane"].rsplit("-", 1)
    assert number == "2"
    tracker = spark.sparkContext.statusTracker()
    [first], [second] = (tracker.getJobIdsForGroup(f"{pool_id}-{n}") for n in (1, 2))
    assert [tracker.getJobInfo(j).status for j in (first, second)] == ["FAILED", "SUCCEEDED"]
    assert tracker.getActiveJobsIds() == []


def hold(x, log_dir, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.path.join(log_dir, f"{x}-rank{get_context().rank}"), "w") as f:
        f.write(f"{start} {time.time()}")
    return x


def test_a_run_waiting_for_slots_gets_them_between_two_trials(spark_local, tmp_path):
    trials_dir, run_dir = tmp_path / "trials", tmp_path / "run"
    trials_dir.mkdir()
    run_dir.mkdir()
    study = optuna.create_study()
    for x in range(4):
        study.enqueue_trial({"x": x})
    outside = {}

    def run_beside_the_study():
        while not list(trials_dir.iterdir()):  # once the first trial has ended
            time.sleep(0.05)
        outside["result"] = Distributor(num_processes=2, verbose=False).run(hold, "outside", str(run_dir), 0.5)

    thread = threading.Thread(target=run_beside_the_study)
    thread.start()
    # 2-rank trials on local[2]: the study's one lane holds both slots.
    optimize(study, lambda t: (hold, (t.suggest_int("x", 0, 9), str(trials_dir), 1.0)), 4, num_processes=2)
    thread.join(120)
    assert outside == {"result": "outside"} and [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    run_start = min(float(p.read_text().split()[0]) for p in run_dir.iterdir())
    last_trial_start = max(float(p.read_text().split()[0]) for p in trials_dir.iterdir())
    assert run_start < last_trial_start  # it ran between two trials, not after the study
