"""spark_dist.tune with real Optuna and real rank processes (local_mode: no JVM): trial values are what rank 0
returned, a failed trial carries the rank's error while the study goes on, a pruned trial's ranks are stopped,
a study in SQLite resumes after its driver was killed, and MLflow gets a parent run and a child per trial."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spark_dist import get_context
from spark_dist.tune import optimize

optuna = pytest.importorskip("optuna")


def quadratic(x, fail_at=None):
    ctx = get_context()
    if ctx.rank == 1 and x == fail_at:
        raise ValueError(f"no good at x={x}")
    for epoch in range(2):
        ctx.report(epoch=epoch, loss=(x - 2) ** 2 + 1.0 / (epoch + 1))
    return (x - 2) ** 2 + 100 * ctx.rank  # only rank 0's counts


def enqueued(*xs, **create):
    study = optuna.create_study(**create)
    for x in xs:
        study.enqueue_trial({"x": x})
    return study


def test_values_are_rank_0s_results_and_a_failed_trial_is_recorded_while_the_study_goes_on():
    study = enqueued(1.0, 3.5, 4.0)
    optimize(study, lambda t: (quadratic, (t.suggest_float("x", 0, 5),), {"fail_at": 3.5}), 3, num_processes=2,
             local_mode=True, max_concurrent=2)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert [trials[0].value, trials[2].value] == [1.0, 4.0]
    assert "rank 1" in trials[1].user_attrs["error"] and "no good at x=3.5" in trials[1].user_attrs["error"]
    assert study.best_trial.params == {"x": 1.0}


def report_then_hang(x, pid_dir):
    ctx = get_context()
    open(os.path.join(pid_dir, f"x{x}-rank{ctx.rank}.pid"), "w").write(str(os.getpid()))
    for epoch in range(3):
        ctx.report(epoch=epoch, loss=x)
        if x > 10:
            time.sleep(600)  # a bad trial the pruner must stop
    return x


def test_a_pruned_trials_ranks_are_stopped_and_the_next_trial_runs(tmp_path):
    study = enqueued(50.0, 1.0, pruner=optuna.pruners.ThresholdPruner(upper=10.0))
    started = time.monotonic()
    optimize(study, lambda t: (report_then_hang, (t.suggest_float("x", 0, 100), str(tmp_path))), 2,
             num_processes=2, local_mode=True, metric="loss")
    assert time.monotonic() - started < 120  # not the 600 s the bad trial would sleep
    pruned, done = sorted(study.trials, key=lambda t: t.number)
    assert pruned.state.name == "PRUNED" and pruned.intermediate_values == {0: 50.0}
    assert done.state.name == "COMPLETE" and done.value == 1.0 and done.intermediate_values == {0: 1, 1: 1, 2: 1}
    pids = [int(p.read_text()) for p in tmp_path.glob("x50.0-rank*.pid")]
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().split(") ")[-1][0] != "Z"


DRIVER = textwrap.dedent("""
    import os, sys, time, optuna
    from spark_dist import get_context
    from spark_dist.tune import optimize

    def hang(x, marker):
        open(marker, "w").write("running")
        time.sleep(600)

    storage = optuna.storages.RDBStorage(sys.argv[1], heartbeat_interval=1, grace_period=2,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
    study = optuna.create_study(study_name="resumed", storage=storage, load_if_exists=True)
    study.enqueue_trial({"x": 1.5})
    optimize(study, lambda t: (hang, (t.suggest_float("x", 0, 5), sys.argv[2])), 1, local_mode=True)
""")


def test_a_study_in_sqlite_resumes_after_its_driver_was_killed_mid_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    marker = tmp_path / "running"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, url, str(marker)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the first driver's trial never started"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its rank processes, as a lost machine would
        driver.wait()
    time.sleep(3)  # past the storage's grace period: the trial's heartbeat stopped

    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2,
                                         heartbeat_stale_trial_callback=retry)
    study = optuna.load_study(study_name="resumed", storage=storage)
    assert [t.state.name for t in study.trials] == ["RUNNING"]
    optimize(study, lambda t: (quadratic, (t.suggest_float("x", 0, 5),)), 2, local_mode=True)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].params == {"x": 1.5} and trials[1].value == 0.25  # the lost trial, run again
    again = optuna.load_study(study_name="resumed", storage=url)  # as a third driver would find it
    assert len(again.trials) == 3 and again.best_value == min(t.value for t in trials[1:])


def test_mlflow_gets_a_parent_run_for_the_study_and_a_child_per_trial(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    mlflow.set_tracking_uri(uri)
    try:
        study = enqueued(1.0, 50.0, study_name="tracked", pruner=optuna.pruners.ThresholdPruner(upper=10.0))
        optimize(study, lambda t: (quadratic, (t.suggest_float("x", 0, 100),)), 2, local_mode=True,
                 metric="loss", max_concurrent=2)
    finally:
        mlflow.set_tracking_uri("")
    client = mlflow.MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    [parent] = [r for r in runs if r.info.run_name == "tracked"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["trial-0", "trial-1"] and len(runs) == 3
    done, pruned = children["trial-0"], children["trial-1"]
    assert done.info.status == "FINISHED" and done.data.tags["optuna.trial_state"] == "COMPLETE"
    assert done.data.params["x"] == "1.0" and done.data.metrics["value"] == 1.0
    assert [(m.step, m.value) for m in client.get_metric_history(done.info.run_id, "loss")] == [(0, 2.0), (1, 1.5)]
    assert pruned.info.status == "KILLED" and pruned.data.tags["optuna.trial_state"] == "PRUNED"
    assert parent.info.status == "FINISHED" and parent.data.metrics["best_value"] == 1.0
    assert parent.data.tags["best_params.x"] == "1.0" and mlflow.active_run() is None
