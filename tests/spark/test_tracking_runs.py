"""MLflow on the driver (real mlflow, a local file store read back with MlflowClient)."""
import os

import pytest

from spark_dist import Distributor, get_context

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    # MLflow 3 keeps its file store for those who opt in; a database is its default.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    mlflow.set_tracking_uri(uri)
    yield mlflow.MlflowClient(uri)
    mlflow.set_tracking_uri("")  # back to "not set": later tests log nothing


def report_epochs():
    ctx = get_context()
    for epoch in range(3):
        ctx.report(epoch=epoch, loss=1.0 / (epoch + 1))
    return ctx.rank


def only_runs(client):
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_a_run_logs_params_metrics_with_steps_and_input_waits(spark_local, file_store):
    Distributor(num_processes=2, verbose=False, run_id="tracked").run(report_epochs)
    [run] = only_runs(file_store)
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["num_processes"] == "2" and run.data.params["backend"] == "ddp"
    history = file_store.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, 1.0 / 3)]  # rank 0's, at its epochs
    assert mlflow.active_run() is None  # the run it started, it ended


def test_a_run_logs_into_the_users_active_run_and_leaves_it_open(spark_local, file_store):
    with mlflow.start_run(run_name="mine") as mine:
        Distributor(num_processes=2, verbose=False).run(report_epochs)
        assert mlflow.active_run().info.run_id == mine.info.run_id
    [run] = only_runs(file_store)
    assert run.info.run_name == "mine" and len(file_store.get_metric_history(run.info.run_id, "loss")) == 3


def test_the_estimator_logs_its_history_and_model(spark_local, file_store, tmp_path):
    from spark_dist.ml import TorchModel
    from test_ml import digits_pandas, digits_pipeline

    train = spark_local.createDataFrame(digits_pandas().head(400))
    pipeline, estimator = digits_pipeline("ddp")
    estimator.setEpochs(2)
    fitted = pipeline.fit(train)
    [run] = only_runs(file_store)
    assert run.data.params["epochs"] == "2" and run.info.status == "FINISHED"
    assert [m.step for m in file_store.get_metric_history(run.info.run_id, "train_loss")] == [0, 1]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="model",
                                               tracking_uri=mlflow.get_tracking_uri(), dst_path=str(tmp_path))
    loaded = TorchModel.load(path)
    assert loaded.history == fitted.stages[-1].history


def test_without_a_tracking_uri_or_run_nothing_is_logged(spark_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    Distributor(num_processes=2, verbose=False).run(report_epochs)
    assert not os.path.exists(tmp_path / "mlruns") and not os.path.exists(tmp_path / "mlflow.db")


