"""A model kept each of the ways people keep one, loaded by spark_dist.inference's loaders inside
``make_predict_fn`` on the executors and run by ``predict_batch_udf`` on local[2]: the checkpoint a Distributor
run saved, a saved TorchModel, a ``save_pretrained`` directory, an MLflow run's model. Each gives the
predictions the saved model gives here. tests/unit/test_inference_models.py tests the loading itself."""
import functools
import os

import numpy as np
import pytest
import torch
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, FloatType
from torch import nn

from spark_dist import Distributor, get_context, predict_batch_udf
from spark_dist.inference import load_from_checkpoint, load_mlflow_model, load_pickled_module, load_pretrained

ROWS = 40
SCORES = ArrayType(FloatType())


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def features(spark):
    """id and x = [id/40, -id/40, 1, id mod 3] as floats; two partitions."""
    a = F.col("id") / ROWS
    return spark.range(0, ROWS, 1, 2).withColumn("x", F.array(a, -a, F.lit(1.0), F.col("id") % 3).cast("array<float>"))


def expected(model, rows):
    x = torch.tensor(np.array([r["x"] for r in rows], dtype=np.float32))
    with torch.no_grad():
        return model(x).numpy()


def predicted(df, udf, column="x"):
    rows = df.withColumn("scores", udf(column)).orderBy("id").collect()
    assert [r["id"] for r in rows] == list(range(ROWS))
    return rows, np.array([r["scores"] for r in rows], dtype=np.float32)


def scores_of(model):
    """The predict function over ``[rows, 4]`` float arrays."""
    def predict(x):
        with torch.inference_mode():
            return model(torch.from_numpy(x)).numpy()
    return predict


# Run in the Python workers (pickled by reference: they import this module).
def from_checkpoint(path):
    return scores_of(load_from_checkpoint(mlp, path))


def from_pickled(path):
    return scores_of(load_pickled_module(path))


def from_mlflow(uri, tracking_uri):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the test's file store: MLflow 3 asks for the opt-in
    return scores_of(load_mlflow_model(uri, tracking_uri=tracking_uri))


def train_and_checkpoint():
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    get_context().save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1})


def test_a_distributor_runs_checkpoint_predicts_on_the_executors(spark_local, tmp_path):
    Distributor(num_processes=1, verbose=False, checkpoint_dir=str(tmp_path), run_id="trained").run(
        train_and_checkpoint)
    udf = predict_batch_udf(functools.partial(from_checkpoint, str(tmp_path / "trained")), return_type=SCORES,
                            batch_size=8, input_tensor_shapes=[[4]])
    rows, scores = predicted(features(spark_local), udf)
    np.testing.assert_allclose(scores, expected(mlp(), rows), rtol=1e-6)


def test_a_saved_torch_model_predicts_on_the_executors(spark_local, tmp_path):
    from spark_dist.ml import TorchModel

    TorchModel(model=mlp(), featuresCol="x", loss="mse").write().save(str(tmp_path / "stage"))
    udf = predict_batch_udf(functools.partial(from_pickled, str(tmp_path / "stage")), return_type=SCORES,
                            batch_size=8, input_tensor_shapes=[[4]])
    rows, scores = predicted(features(spark_local), udf)
    np.testing.assert_allclose(scores, expected(mlp(), rows), rtol=1e-6)


def bert_logits(path):
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded: the directory has it all
    model = load_pretrained(path)

    def predict(ids):  # [rows, 6] token ids, 0 for padding
        ids = torch.from_numpy(ids).long()
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=(ids != 0).long()).logits.numpy()
    return predict


def test_a_save_pretrained_directory_predicts_on_the_executors(spark_local, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "bert")
    ids = F.col("id")
    df = spark_local.range(0, ROWS, 1, 2).withColumn(  # token ids of varying length, padded to 6
        "tokens", F.array(F.lit(1), ids % 50, (ids * 7) % 50, F.when(ids % 2 == 0, 9).otherwise(0),
                          F.when(ids % 4 == 0, 2).otherwise(0), F.lit(0)))
    udf = predict_batch_udf(functools.partial(bert_logits, str(tmp_path / "bert")), return_type=SCORES,
                            batch_size=16, input_tensor_shapes=[[6]])
    rows, scores = predicted(df, udf, "tokens")
    tokens = torch.tensor([r["tokens"] for r in rows])
    with torch.no_grad():
        want = model(input_ids=tokens, attention_mask=(tokens != 0).long()).logits.numpy()
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-6)


def test_an_mlflow_runs_model_predicts_on_the_executors(spark_local, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow = pytest.importorskip("mlflow")
    import mlflow.pytorch

    store = f"file:{tmp_path / 'mlruns'}"
    client = mlflow.MlflowClient(store)
    run = client.create_run(client.create_experiment("inference"))
    mlflow.set_tracking_uri(store)
    try:
        with mlflow.start_run(run_id=run.info.run_id):
            example = np.zeros((2, 4), dtype=np.float32)
            mlflow.pytorch.log_model(mlp(), name="model", input_example=example, pip_requirements=["torch"])
    finally:
        mlflow.set_tracking_uri("")
    udf = predict_batch_udf(functools.partial(from_mlflow, f"runs:/{run.info.run_id}/model", store),
                            return_type=SCORES, batch_size=8, input_tensor_shapes=[[4]])
    rows, scores = predicted(features(spark_local), udf)
    np.testing.assert_allclose(scores, expected(mlp(), rows), rtol=1e-6)
