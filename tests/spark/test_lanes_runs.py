"""Lanes (spark_dist.driver.lanes) under a tuning study on real Spark: a failed trial is retried on a new lane,
whether its lane lived on or its job was lost; a trial preempted (its worker decommissioned) goes on from its
checkpoint on a new lane, on the executor left, and the cluster serves the next test whole; where spark.dist.storePort has no ports to spare, each trial is
a job of its own; a run of this process that waits for slots gets them between two trials, not after the study.
(That trials share a lane's job and its warm workers: tests/spark/test_tune_runs.py.)"""
import os
import signal
import threading
import time

import pytest

from free_ports import free_ports
from spark_dist import Distributor, get_context
from spark_dist.tune import optimize

optuna = pytest.importorskip("optuna")


def fail_once(x, marker_dir):
    """The first attempt of x=7 exits its rank (the lane lives on); that of x=8 kills the Python worker its rank
    was forked from (the lane's task dies with it, and its job with the task). A retry returns x."""
    marker = os.path.join(marker_dir, f"failed-{x}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        if x == 8:
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
        os._exit(3)
    return float(x)


def retry_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "spark_dist" and "retrying" in r.getMessage()]


def test_a_retry_runs_on_a_new_lane_whether_its_lane_lived_or_was_lost(spark_local, tmp_path, caplog):
    spark = spark_local
    study = optuna.create_study()
    study.enqueue_trial({"x": 7})
    study.enqueue_trial({"x": 8})
    optimize(study, lambda t: (fail_once, (t.suggest_int("x", 0, 9), str(tmp_path))), 2, max_retries=1,
             max_concurrent=1)
    assert [(t.state.name, t.value) for t in study.trials] == [("COMPLETE", 7.0), ("COMPLETE", 8.0)]
    # The study's lanes are numbered as started. Trial 0 failed on lane 1, which then returned when it was
    # closed, and was retried on lane 2; trial 1 took lane 2 from the pool, lost it with the worker, and was
    # retried on lane 3, which ended with the study. None is left running.
    lanes = [t.user_attrs["spark_dist_lane"].rsplit("-", 1) for t in study.trials]
    assert [number for _, number in lanes] == ["2", "3"]
    pool_id = lanes[0][0]
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobIdsForGroup(f"{pool_id}-{n}") for n in (1, 2, 3)]
    assert [tracker.getJobInfo(j).status for [j] in jobs] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert tracker.getActiveJobsIds() == []
    # Each failed attempt is said as it was: the rank's exit, and the lost job in Spark's own words.
    exited, lost = retry_warnings(caplog)
    assert "rank 0 on host 127.0.0.1 exited with code 3" in exited, exited
    assert "rank 0 on host 127.0.0.1: its Spark task failed: Python worker exited unexpectedly" in lost, lost


def test_where_the_store_ports_leave_no_room_for_lanes_each_trial_is_a_job(spark_local, runtime_conf, tmp_path):
    # Two trials at once need two stores of their own; lanes would need two more: three ports are too few.
    first = free_ports(3)
    runtime_conf("spark.dist.storePort", f"{first}-{first + 2}")
    study = optuna.create_study()
    optimize(study, lambda t: (float, (t.suggest_int("x", 0, 9),)), 2, max_concurrent=2)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    assert all("spark_dist_lane" not in t.user_attrs for t in study.trials)
    tracker = spark_local.sparkContext.statusTracker()
    for trial in study.trials:  # its run's own barrier job, under its run's job group
        [job] = tracker.getJobIdsForGroup(f"spark_dist-{trial.user_attrs['spark_dist_run_id']}-0")
        assert tracker.getJobInfo(job).status == "SUCCEEDED"


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
    outside, study_over = {}, threading.Event()

    def run_beside_the_study():
        deadline = time.monotonic() + 120
        while not list(trials_dir.iterdir()):  # once the first trial has ended
            if study_over.is_set() or time.monotonic() > deadline:  # the study failed, or no trial ever ended
                return
            time.sleep(0.05)
        outside["result"] = Distributor(num_processes=2, verbose=False).run(hold, "outside", str(run_dir), 0.5)

    # A daemon: should it still be waiting when the test fails, it never keeps pytest from exiting.
    thread = threading.Thread(target=run_beside_the_study, daemon=True)
    thread.start()
    try:
        # 2-rank trials on local[2]: the study's one lane holds both slots.
        optimize(study, lambda t: (hold, (t.suggest_int("x", 0, 9), str(trials_dir), 1.0)), 4, num_processes=2)
    finally:
        study_over.set()
    thread.join(120)
    assert not thread.is_alive()
    assert outside == {"result": "outside"} and [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    run_start = min(float(p.read_text().split()[0]) for p in run_dir.iterdir())
    last_trial_start = max(float(p.read_text().split()[0]) for p in trials_dir.iterdir())
    assert run_start < last_trial_start  # it ran between two trials, not after the study


def paced_steps(steps, marker_dir):
    """``steps`` checkpointed steps of 0.25 s (0.05 s after the first attempt): rank 0 stops at a checkpoint
    when its executor is being decommissioned. Each step leaves a marker ``<attempt>-<step>`` holding the rank's
    pid."""
    ctx = get_context()
    state = ctx.load_checkpoint() or {"step": 0}
    for step in range(state["step"], steps):
        time.sleep(0.25 if ctx.attempt == 0 else 0.05)
        with open(os.path.join(marker_dir, f"{ctx.attempt}-{step + 1}"), "w") as f:
            f.write(str(os.getpid()))
        ctx.save_checkpoint({"step": step + 1})
    return float(ctx.attempt)


def worker_of(cluster, pid):
    """The standalone worker whose executor the process ``pid`` descends from."""
    import psutil

    ancestors = {p.pid for p in psutil.Process(pid).parents()}
    [worker] = [i for i in range(len(cluster.workers)) if ancestors & set(cluster.executor_pids(worker=i))]
    return worker


def test_a_preempted_trial_goes_on_from_its_checkpoint_on_a_new_lane(spark_standalone, standalone_cluster,
                                                                      tmp_path):
    import collections

    import psutil

    from spark_dist.spark import session

    cluster, seen = standalone_cluster, {}

    def decommission_under_the_trial():
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "0-2").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["worker"] = worker_of(cluster, int((tmp_path / "0-2").read_text()))
            executor = psutil.Process(cluster.executor_pids(worker=seen["worker"])[0])
            os.kill(cluster.worker_pids[seen["worker"]], signal.SIGPWR)  # what sbin/decommission-worker.sh sends
            while not list(tmp_path.glob("1-*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            if list(tmp_path.glob("1-*")):  # the next attempt runs: its worker is known before this one goes
                seen["next worker"] = worker_of(cluster, int(next(tmp_path.glob("1-*")).read_text()))
            executor.wait(timeout=30)
            cluster.replace_worker(seen["worker"])
        except BaseException as exc:  # noqa: BLE001 -- said by the test's assertions
            seen["error"] = repr(exc)

    operator = threading.Thread(target=decommission_under_the_trial, daemon=True)
    operator.start()
    study = optuna.create_study()
    optimize(study, lambda t: (paced_steps, (40, str(tmp_path))), 1, max_concurrent=1)
    operator.join(180)
    [trial] = study.trials
    assert "error" not in seen, seen["error"]
    assert trial.state.name == "COMPLETE"
    # One preemption, one restart (not a retry: max_retries=0), matched by executor: the neighbour executor on the
    # same host never counts. Attempt 1 went on from attempt 0's last checkpoint, on a new lane, on the executor
    # of the other worker.
    steps = collections.defaultdict(list)
    for marker in tmp_path.glob("*-*"):
        attempt, step = map(int, marker.name.split("-"))
        steps[attempt].append(step)
    assert trial.value == 1.0 and sorted(steps) == [0, 1] and max(steps[1]) == 40
    assert min(steps[1]) == max(steps[0]) + 1
    assert trial.user_attrs["spark_dist_lane"].endswith("-2")
    assert seen["next worker"] != seen["worker"]
    deadline = time.monotonic() + 90  # the replaced worker's executor back: the cluster serves the next test whole
    while session.task_slots(spark_standalone) != 2:
        assert time.monotonic() < deadline, "the replaced worker's executor did not join"
        time.sleep(0.2)
