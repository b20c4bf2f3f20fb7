"""MLflow tracking (spark_dist.driver.tracking) without Spark: imported only where it can be in use."""
import os

import pytest


@pytest.mark.parametrize("tracking_uri, imported", [(None, False), ("file:./mlruns-probe", True)])
def test_mlflow_is_imported_only_where_it_can_be_in_use(tmp_path, tracking_uri, imported):
    # import mlflow is slow (BENCHMARKS.md, Spark ML): a process that never imported it and has no tracking URI
    # cannot have an active run or a URI set, so it is not imported there (a fresh interpreter shows it).
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    probe = ("import sys; from spark_dist.driver.tracking import _mlflow; "
             "in_use = _mlflow() is not None; print('mlflow' in sys.modules, in_use)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == [str(imported), str(imported)]


def test_an_elastic_runs_world_size_is_a_metric_over_its_attempts(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from spark_dist.driver.tracking import Tracker

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        tracker = Tracker("elastic-run", {"num_processes": 4, "min_processes": 2})
        run_id = mlflow.active_run().info.run_id
        for attempt, size in enumerate((4, 2, 4)):  # lost a host, then grew back
            tracker.world_size(attempt, size)
        tracker.end()
        history = mlflow.MlflowClient().get_metric_history(run_id, "world_size")
        assert [(m.step, m.value) for m in history] == [(0, 4.0), (1, 2.0), (2, 4.0)]
        assert mlflow.get_run(run_id).data.params["min_processes"] == "2"
    finally:
        mlflow.set_tracking_uri("")  # back to "not set": later tests log nothing
