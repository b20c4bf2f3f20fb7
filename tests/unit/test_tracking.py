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
