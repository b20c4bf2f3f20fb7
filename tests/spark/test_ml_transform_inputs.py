"""TorchEstimator / TorchModel on columns a model cannot take as they are: JPEG bytes decoded by ``transformFn``,
text and token sequences of varying length; the transform persisted with the stage, applied again at inference
(batch and streaming DataFrames alike), and refused or named where it cannot work, on local[2]."""
import io

import numpy as np
import pytest
import torch
from torch import nn

from spark_dist import ConfigError
from spark_dist.ml import TorchEstimator, TorchModel
from test_deep_learning_inputs import jpeg_frame, tiny_cnn, write_jpegs
from test_ml import refused_fit_jobs

# What the loader's workers and Spark's Python workers run is pickled by reference: they import this module.


def pixels_of(batch, flip=False):
    """JPEG bytes -> a normalised ``[rows, 3, 32, 32]`` tensor; each image flipped left-right with probability 1/2
    when ``flip`` (``torch``'s generator is seeded per batch during fit)."""
    from PIL import Image

    images = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=np.float32) / 255.0
                       for b in batch["content"]])
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    if flip:
        flipped = torch.rand(len(x)) < 0.5
        x[flipped] = x[flipped].flip(-1)
    return (x - 0.5) / 0.25


def augmented(batch):
    return pixels_of(batch, flip=True)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    pytest.importorskip("PIL")
    folder = tmp_path_factory.mktemp("jpegs")
    write_jpegs(folder / "train", per_class=80, seed=0)
    write_jpegs(folder / "test", per_class=30, seed=1)
    return folder


@pytest.fixture(scope="module")
def fits():
    return {}


@pytest.fixture
def fitted(spark_local, jpegs, fits):
    """A small CNN fitted on 160 JPEGs (a fifth held out for validation), in one worker process per rank: once
    for the module's tests (the session fixture is per test, the session the same)."""
    if "cnn" not in fits:
        torch.manual_seed(0)  # the starting weights
        est = TorchEstimator(model=tiny_cnn(), featuresCol="content", labelCol="label", transformFn=augmented,
                             inferenceTransformFn=pixels_of, transformWorkers=1, epochs=2, batchSize=16,
                             learningRate=3e-3, numProcesses=2, validationFraction=0.2, seed=7)
        fits["cnn"] = est, est.fit(jpeg_frame(spark_local, jpegs / "train"))
    return fits["cnn"]


def by_hand(model, rows):
    """``(predictions, raw outputs)`` of the model on the rows, decoded by the inference transform here."""
    with torch.no_grad():
        out = model.getModel()(pixels_of({"content": [bytes(r["content"]) for r in rows]}))
    return out.argmax(1).double().numpy(), out.double().numpy()


def test_jpeg_bytes_train_a_cnn_and_predict_as_the_same_transform_does_by_hand(spark_local, jpegs, fitted):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    _, model = fitted
    assert [r["epoch"] for r in model.history] == [0, 1] and "val_accuracy" in model.history[-1]
    assert model.getInferenceTransformFn() is pixels_of and model.getTransformFn() is augmented
    test = jpeg_frame(spark_local, jpegs / "test")
    predicted = model.transform(test)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(predicted)
    print(f"held-out accuracy {accuracy:.3f}; history {model.history[-1]}")
    assert accuracy > 0.8  # two balanced classes: chance is 0.5
    rows = predicted.orderBy("content").collect()
    expected, raw = by_hand(model, rows)
    assert [r["prediction"] for r in rows] == expected.tolist()
    np.testing.assert_allclose(np.stack([r["rawPrediction"].toArray() for r in rows]), raw, rtol=1e-4, atol=1e-5)


def test_the_transforms_are_saved_and_loaded_with_the_stages(spark_local, jpegs, fitted, tmp_path):
    est, model = fitted
    est.write().overwrite().save(str(tmp_path / "est"))
    model.write().overwrite().save(str(tmp_path / "model"))
    est2, model2 = TorchEstimator.load(str(tmp_path / "est")), TorchModel.load(str(tmp_path / "model"))
    assert est2.getTransformWorkers() == 1 and model2.getTransformWorkers() == 1
    batch = {"content": [bytes(r["content"]) for r in jpeg_frame(spark_local, jpegs / "test").limit(3).collect()]}
    for loaded in (est2, model2):
        assert torch.equal(loaded.getInferenceTransformFn()(batch), pixels_of(batch))
        assert loaded.getTransformFn()(batch).shape == (3, 3, 32, 32)
    test = jpeg_frame(spark_local, jpegs / "test")
    before = {bytes(r["content"]): r["prediction"] for r in model.transform(test).collect()}  # 3.5: bytearray
    after = {bytes(r["content"]): r["prediction"] for r in model2.transform(test).collect()}
    assert before == after and model2.history == model.history


def run_stream(spark, stream, name):
    """Every row of a streaming DataFrame, as a memory sink holds them once the query has read all input."""
    query = stream.writeStream.format("memory").queryName(name).outputMode("append").start()
    try:
        query.processAllAvailable()
        return spark.table(name).collect()
    finally:
        query.stop()


def test_a_streaming_dataframe_gets_the_predictions_a_batch_one_gets(spark_local, jpegs, fitted, tmp_path):
    _, model = fitted
    test = jpeg_frame(spark_local, jpegs / "test")
    test.repartition(3).write.parquet(str(tmp_path / "in"))
    stream = spark_local.readStream.schema(test.schema).option("maxFilesPerTrigger", 2).parquet(str(tmp_path / "in"))
    assert stream.isStreaming
    streamed = run_stream(spark_local, model.transform(stream), "jpeg_predictions")
    batch = {bytes(r["content"]): (r["prediction"], tuple(r["rawPrediction"]))
             for r in model.transform(test).collect()}
    assert len(streamed) == len(batch) == 60
    for r in streamed:
        prediction, raw = batch[bytes(r["content"])]
        assert r["prediction"] == prediction
        np.testing.assert_allclose(r["rawPrediction"].toArray(), raw, rtol=1e-5, atol=1e-6)


# -- text and token sequences, through a model made around a module ------------------------------------------
class Words(nn.Module):
    """A bag of embeddings over the padded token ids, masked by their lengths, and one more input (the text's
    length in characters)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.out = nn.Embedding(20, 4), nn.Linear(5, 3)

    def forward(self, tokens, lengths, chars):
        mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).float()
        pooled = (self.embed(tokens) * mask[..., None]).sum(1) / lengths.clamp(min=1)[:, None]
        return self.out(torch.cat([pooled, chars[:, None]], dim=1))


def words_input(batch):
    """The model's keyword arguments from a string column, a sequence column (padded, with its lengths) and a
    nested array column (``[rows, 2, 2]``)."""
    assert batch["grid"].shape[1:] == (2, 2) and batch["grid"].dtype == torch.float32
    return {"tokens": batch["tokens"], "lengths": batch["tokens_lengths"],
            "chars": torch.tensor([len(t) / 10.0 for t in batch["text"]]) + batch["grid"].sum((1, 2)) / 100}


def words_by_hand(module, rows):
    """The module's outputs on ``rows`` (id, text, tokens, grid), padded and measured here."""
    lengths = torch.tensor([len(r[2]) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        tokens[i, :len(r[2])] = torch.tensor(r[2], dtype=torch.int64)
    with torch.no_grad():
        chars = torch.tensor([len(r[1]) / 10.0 for r in rows]) + 3.0 / 100  # each grid sums to 3
        return module(tokens, lengths, chars).double().numpy()


def test_strings_sequences_and_nested_arrays_fit_and_reach_the_transform_as_the_loader_gives_them(spark_local,
                                                                                                 tmp_path):
    from pyspark.sql import types as T

    rng = np.random.default_rng(3)
    rows = [(i, " ".join("w" * int(n) for n in rng.integers(1, 4, size=int(rng.integers(1, 5)))),
             [int(t) for t in rng.integers(0, 20, size=int(rng.integers(0, 7)))], [[float(i), 1.0], [2.0, -float(i)]],
             i % 3) for i in range(40)]
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("text", T.StringType()),
                           T.StructField("tokens", T.ArrayType(T.IntegerType())),
                           T.StructField("grid", T.ArrayType(T.ArrayType(T.DoubleType()))),
                           T.StructField("label", T.IntegerType())])
    df = spark_local.createDataFrame(rows, schema)
    features = ["text", "tokens", "grid"]
    # Fitted: the tokens' kind (a padded sequence) is known once the cache write has measured their lengths.
    model = TorchEstimator(model=Words(), featuresCol=features, transformFn=words_input, epochs=1, batchSize=8,
                           numProcesses=1).fit(df)
    assert model._feature_kinds == {"text": "string", "tokens": "sequence", "grid": "nested"}
    expected = words_by_hand(model.getModel(), rows)
    got = {r["id"]: r["rawPrediction"].toArray() for r in model.transform(df).collect()}
    np.testing.assert_allclose(np.stack([got[r[0]] for r in rows]), expected, rtol=1e-5, atol=1e-6)
    df.write.parquet(str(tmp_path / "words"))
    stream = spark_local.readStream.schema(schema).parquet(str(tmp_path / "words"))
    streamed = run_stream(spark_local, model.transform(stream), "word_predictions")
    np.testing.assert_allclose(np.stack([r["rawPrediction"].toArray() for r in sorted(streamed)]), expected,
                               rtol=1e-5, atol=1e-6)
    # Made around a module, with loss="mse": the outputs (here 3, a vector per row) are asked of the first rows,
    # which a stream does not have before it starts.
    around = TorchModel(model=Words(), featuresCol=features, transformFn=words_input, loss="mse", batchSize=8)
    with pytest.raises(ConfigError, match="loss='mse' on a streaming DataFrame"):
        around.transform(stream)
    got = {r["id"]: r["prediction"].toArray() for r in around.transform(df).collect()}
    np.testing.assert_allclose(np.stack([got[r[0]] for r in rows]), words_by_hand(Words(), rows), rtol=1e-5,
                               atol=1e-6)


def test_numeric_features_stream_too(spark_local, tmp_path):
    from pyspark.sql import functions as F

    torch.manual_seed(1)
    df = spark_local.range(50).select("id", F.array(*(F.rand(i) for i in range(4))).cast("array<float>")
                                      .alias("x"), (F.col("id") % 3).cast("double").alias("a"))
    df.write.parquet(str(tmp_path / "numbers"))
    df = spark_local.read.parquet(str(tmp_path / "numbers"))
    stream = spark_local.readStream.schema(df.schema).parquet(str(tmp_path / "numbers"))
    classify = TorchModel(model=nn.Linear(4, 3), featuresCol="x")  # no width known: cross_entropy needs none
    regress = TorchModel(model=nn.Linear(2, 1), featuresCol=["id", "a"], loss="mse",
                         predictionCol="y")  # the width from the column list
    for model, column in ((classify, "prediction"), (regress, "y")):
        batch = {r["id"]: r[column] for r in model.transform(df).collect()}
        streamed = {r["id"]: r[column] for r in run_stream(spark_local, model.transform(stream), f"n_{column}")}
        assert streamed == pytest.approx(batch) and len(streamed) == 50


# -- refused, before any training job ---------------------------------------------------------------------------
def broken(batch):
    raise RuntimeError("cannot decode")


@pytest.mark.parametrize("case", ["binary without a transform", "a transform that fails", "a model that does not fit",
                                  "a map column"])
def test_bad_transform_inputs_are_named_before_any_training_job(spark_local, jpegs, case):
    from pyspark.sql import functions as F

    df = jpeg_frame(spark_local, jpegs / "test")
    est, data, message = {
        "binary without a transform": (TorchEstimator(model=tiny_cnn(), featuresCol="content"), df,
                                       "featuresCol: column 'content' has type binary.*set the transformFn Param"),
        "a transform that fails": (TorchEstimator(model=tiny_cnn(), featuresCol="content", transformFn=broken), df,
                                   r"transformFn failed on the first 2 rows.*\{'content': list of 2 bytes\}.*"
                                   "RuntimeError: cannot decode"),
        "a model that does not fit": (TorchEstimator(model=nn.Linear(3, 2), featuresCol="content",
                                                     transformFn=pixels_of), df,
                                      r"model cannot take what transformFn returns \(tensor\(2, 3, 32, 32\)"),
        "a map column": (TorchEstimator(model=tiny_cnn(), featuresCol="meta", transformFn=pixels_of),
                         df.withColumn("meta", F.create_map(F.lit("k"), F.lit(1))), "column 'meta' has type map"),
    }[case]
    jobs = refused_fit_jobs(spark_local, est, data, message)
    # Schema errors: no job; the others: only the small job that reads the first rows, never the cache write.
    assert len(jobs) <= (0 if "column" in case or "binary" in case else 2)
