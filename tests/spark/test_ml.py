"""spark_dist.ml: TorchEstimator / TorchModel in Pipelines, tuning, persistence, and bad input, on local[2]."""
import functools
import logging

import numpy as np
import pytest
import torch
from torch import nn

from spark_dist import ConfigError
from spark_dist.ml import TorchEstimator, TorchModel
from spark_dist.ml.training import learning_rate_at

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except ImportError:
    HAVE_HOROVOD = False

PIXELS = [f"p{i}" for i in range(64)]


@functools.lru_cache(maxsize=1)
def digits_pandas():
    """sklearn's digits (1,797 8x8 images): 64 pixel columns scaled to [0, 1], a long label, an id."""
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    pdf = pd.DataFrame(digits.data / 16.0, columns=PIXELS)
    pdf["label"] = digits.target.astype("int64")
    pdf["id"] = np.arange(len(pdf))
    return pdf


def digits_split(spark):
    df = spark.createDataFrame(digits_pandas())
    return df.randomSplit([0.8, 0.2], seed=42)


def digits_arrays(spark):
    """The same rows with the pixels as one array<float> column ("features")."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(digits_pandas())
    return df.select(F.array(*PIXELS).cast("array<float>").alias("features"), "label")


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def accuracy(df):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(df)


def digits_pipeline(backend, **params):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    est = TorchEstimator(model=mlp(), featuresCol="features", labelCol="label", loss="cross_entropy", epochs=10,
                         batchSize=32, learningRate=0.003, numProcesses=2, backend=backend, **params)
    return Pipeline(stages=[VectorAssembler(inputCols=PIXELS, outputCol="features"), est]), est


def predictions(df):
    return {r["id"]: (r["prediction"], tuple(r["rawPrediction"].toArray()))
            for r in df.select("id", "prediction", "rawPrediction").collect()}


# -- real data: 2 ranks on the digits ------------------------------------------------------------------------
def test_a_rank_imports_the_training_code_without_pyspark_ml_or_pandas():
    # Every rank of every fit imports spark_dist.ml.training; it must not import pyspark.ml and pandas with it.
    import subprocess
    import sys

    probe = ("import sys, spark_dist.ml.training; "
             "print(sorted(m for m in ('pyspark.ml', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_digits_pipeline_ddp_learns_and_keeps_history(spark_local, caplog):
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType

    train, test = digits_split(spark_local)
    pipeline, est = digits_pipeline("ddp", validationFraction=0.1)
    before = [p.detach().clone() for p in est.getModel().parameters()]
    with caplog.at_level(logging.INFO, logger="spark_dist"):
        fitted = pipeline.fit(train)
    model = fitted.stages[-1]
    out = model.transform(fitted.stages[0].transform(test))
    assert accuracy(out) >= 0.93
    assert out.schema["prediction"].dataType == DoubleType()
    assert isinstance(out.schema["rawPrediction"].dataType, VectorUDT)
    assert len(model.history) == 10 and [h["epoch"] for h in model.history] == list(range(10))
    last = model.history[-1]
    assert last["train_loss"] < model.history[0]["train_loss"] and last["val_accuracy"] > 0.9 and "val_loss" in last
    # The linear scaling rule: 2 ranks, so twice the learning rate once warmed up.
    assert last["learning_rate"] == pytest.approx(0.006)
    # The estimator's own module is untouched; the model holds a trained copy.
    assert all(torch.equal(a, b) for a, b in zip(before, est.getModel().parameters()))
    assert model.getModel() is not est.getModel() and model.numFeatures() == 64 and model.numOutputs() == 10
    assert model.uid == est.uid and model.getLearningRate() == 0.003
    # A small CPU model: replicas without DDP, torch's functional Adam; said in the log and kept by the model.
    assert model.trainingPath()["ranks"] == "replicas"
    assert model.trainingPath()["optimizer"] == "torch.optim.adam.adam (functional)"
    assert any(r.name == "spark_dist" and "as replicas" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod.torch is not installed (make env builds it)")
def test_digits_pipeline_horovod_and_pipeline_model_round_trip(spark_local, tmp_path):
    from pyspark.ml import PipelineModel

    train, test = digits_split(spark_local)
    pipeline, _ = digits_pipeline("horovod")
    fitted = pipeline.fit(train)
    out = fitted.transform(test)
    assert accuracy(out) >= 0.93
    saved = predictions(out)
    path = str(tmp_path / "pipeline_model")
    fitted.write().save(path)
    loaded = PipelineModel.load(path)
    model = loaded.stages[-1]
    assert isinstance(model, TorchModel) and model.getBackend() == "horovod" and len(model.history) == 10
    assert model.trainingPath()["ranks"] == "horovod"  # saved with the model
    assert predictions(loaded.transform(test)) == saved  # exactly the same numbers
    with pytest.raises(Exception, match="already exists"):
        fitted.write().save(path)
    fitted.write().overwrite().save(path)


# -- persistence ------------------------------------------------------------------------------------------
def custom_loss(output, label):
    return nn.functional.cross_entropy(output, label, label_smoothing=0.1)


def sgd_momentum(parameters, lr):
    return torch.optim.SGD(parameters, lr=lr, momentum=0.9)


def test_estimator_and_pipeline_save_load_round_trip(spark_local, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    est = TorchEstimator(model=mlp(3), loss=custom_loss, optimizer=sgd_momentum, featuresCol=["a", "b"],
                         epochs=3, learningRate=0.05, validationCol="is_val", seed=7, backend="horovod")
    est.write().save(str(tmp_path / "est"))
    back = TorchEstimator.load(str(tmp_path / "est"))
    assert back.uid == est.uid
    for name in ("featuresCol", "epochs", "learningRate", "validationCol", "seed", "backend", "batchSize"):
        assert back.getOrDefault(name) == est.getOrDefault(name), name
    assert back.getLoss().__name__ == "custom_loss" and back.getOptimizer().__name__ == "sgd_momentum"
    assert all(torch.equal(a, b) for a, b in zip(back.getModel().state_dict().values(),
                                                 est.getModel().state_dict().values()))
    assert not back.isSet(back.predictionCol) and back.getPredictionCol() == "prediction"

    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="f"), TorchEstimator(model=mlp())])
    pipeline.write().save(str(tmp_path / "pipeline"))
    stages = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert isinstance(stages[1], TorchEstimator) and isinstance(stages[1].getModel(), nn.Sequential)


def test_model_made_around_a_module_predicts_like_torch_on_every_feature_layout(spark_local, tmp_path):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3)).astype(np.float32)
    df = spark_local.createDataFrame([(i, *map(float, row)) for i, row in enumerate(x)],
                                     "id long, a double, b double, c double")
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).squeeze(1).double().numpy()
    model = TorchModel(model=net, featuresCol=["a", "b", "c"], loss="mse")
    by_columns = model.transform(df).orderBy("id").select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_allclose(by_columns, expected, rtol=1e-6)
    arrays = df.select("id", F.array("a", "b", "c").alias("x"))
    by_array = model.copy({model.featuresCol: "x"}).transform(arrays).orderBy("id").toPandas()["prediction"]
    vectors = VectorAssembler(inputCols=["a", "b", "c"], outputCol="v").transform(df)
    by_vector = model.copy({model.featuresCol: "v"}).transform(vectors).orderBy("id").toPandas()["prediction"]
    np.testing.assert_array_equal(by_array.to_numpy(), by_columns)
    np.testing.assert_array_equal(by_vector.to_numpy(), by_columns)
    model.write().save(str(tmp_path / "m"))
    loaded = TorchModel.load(str(tmp_path / "m"))
    again = loaded.transform(df).orderBy("id").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(again, by_columns)


def test_regression_on_numeric_columns_with_a_validation_column(spark_local):
    from pyspark.sql import functions as F

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(600, 2))
    rows = [(float(a), int(b * 3), float(2 * a - 0.5 * int(b * 3)), i % 5 == 0) for i, (a, b) in enumerate(x)]
    df = spark_local.createDataFrame(rows, "x1 double, x2 int, y double, holdout boolean")
    torch.manual_seed(0)
    est = TorchEstimator(model=nn.Linear(2, 1), featuresCol=["x1", "x2"], labelCol="y", loss="mse", optimizer="sgd",
                         learningRate=0.05, epochs=8, batchSize=16, numProcesses=2, validationCol="holdout")
    model = est.fit(df)
    assert [set(h) for h in model.history][0] == {"epoch", "train_loss", "learning_rate", "val_loss"}
    assert model.history[-1]["val_loss"] < 0.05
    out = model.transform(df.filter("holdout"))
    assert dict(out.dtypes)["prediction"] == "double" and "rawPrediction" not in out.columns
    err = out.select(F.avg((F.col("prediction") - F.col("y")) ** 2)).first()[0]
    assert err < 0.05


def test_callable_loss_and_optimizer_train_and_predict_raw_outputs(spark_local):
    from pyspark.ml.linalg import VectorUDT

    df = digits_arrays(spark_local)
    model = TorchEstimator(model=mlp(), loss=custom_loss, optimizer=sgd_momentum, learningRate=0.05, epochs=3,
                           batchSize=64, numProcesses=2).fit(df)
    assert model.history[-1]["train_loss"] < model.history[0]["train_loss"]
    out = model.transform(df)
    assert isinstance(out.schema["prediction"].dataType, VectorUDT)  # a callable loss: the raw outputs
    rows = out.select("label", "prediction").collect()
    right = sum(int(r["prediction"].toArray().argmax() == r["label"]) for r in rows)
    assert right / len(rows) > 0.8


# -- tuning -----------------------------------------------------------------------------------------------
def test_cross_validator_over_two_learning_rates(spark_local, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, CrossValidatorModel, ParamGridBuilder

    df = digits_arrays(spark_local)
    est = TorchEstimator(model=mlp(), epochs=3, batchSize=64, numProcesses=2)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-5, 0.01]).build()
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, numFolds=2, seed=3,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    cv_model = cv.fit(df)
    low, high = cv_model.avgMetrics
    assert high > 0.85 and high > low
    best = cv_model.bestModel
    assert isinstance(best, TorchModel) and best.getLearningRate() == 0.01 and len(best.history) == 3
    assert est.getLearningRate() == 0.001  # the grid's values went to copies
    path = str(tmp_path / "cv_model")
    cv_model.write().save(path)
    loaded = CrossValidatorModel.load(path)
    assert isinstance(loaded.bestModel, TorchModel) and loaded.bestModel.getLearningRate() == 0.01
    assert loaded.avgMetrics == cv_model.avgMetrics


def test_train_validation_split_over_learning_rate_and_epochs(spark_local):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    df = digits_arrays(spark_local)
    est = TorchEstimator(model=mlp(), batchSize=64, numProcesses=2)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-5, 0.01]).addGrid(est.epochs, [1, 2]).build()
    tvs = TrainValidationSplit(estimator=est, estimatorParamMaps=grid, trainRatio=0.75, seed=5,
                               evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    best = tvs.fit(df).bestModel
    assert best.getLearningRate() == 0.01 and best.getEpochs() == 2 and len(best.history) == 2


def test_fit_and_transform_record_no_call_site(spark_local, monkeypatch):
    """PySpark 4 records its caller's stack on every ``F.col`` and ``Column`` method (three py4j calls, and an
    IPython import on the first where IPython is installed). spark_dist builds its Columns from SQL text, so a
    fit (vector features, a validation column, the label range) and transforms (classification outputs, stacked
    columns, a width measured from the data) record none."""
    import traceback

    from pyspark.errors import utils as errors_utils
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    if not hasattr(errors_utils, "_capture_call_site"):
        pytest.skip("PySpark before 4 records no call site")
    df = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(
        spark_local.createDataFrame(digits_pandas())).withColumn("holdout", F.col("id") % 5 == 0)
    no_width = df.select(F.array(*PIXELS).alias("pixels"), "label")  # an array column: no size in the schema
    recorded = []

    def record(depth):  # where in spark_dist (or here) the Column was made
        made_at = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "pyspark" not in f.filename]
        recorded.append(made_at[-2])  # [-1]: this function
        return ""
    monkeypatch.setattr(errors_utils, "_capture_call_site", record)
    monkeypatch.setattr(errors_utils, "_enable_debugging_cache", True)  # PySpark's default, whatever ran before
    F.col("label").alias("y")  # the check can fail: F.col and a Column method, made the usual way, are recorded
    assert len(recorded) == 2
    recorded.clear()

    model = TorchEstimator(model=mlp(), featuresCol="features", labelCol="label", loss="cross_entropy", epochs=2,
                           batchSize=64, numProcesses=2, validationCol="holdout").fit(df)
    outputs = [model.transform(df),
               TorchModel(model=mlp(), featuresCol=PIXELS, loss="cross_entropy").transform(df),
               TorchModel(model=mlp(), featuresCol="pixels", loss="cross_entropy").transform(no_width)]
    assert recorded == []
    assert set(model.history[-1]) >= {"train_loss", "val_loss"}
    for out in outputs:  # what they predict: the tests above, on each feature layout
        assert {"prediction", "rawPrediction"} <= set(out.columns)


def test_names_with_dots_and_spaces_under_regex_column_names(spark_local):
    """With ``spark.sql.parser.quotedRegexColumnNames=true`` (feature-store tools set it) a backticked name with a
    dot or a space is a regex in SQL text: spark_dist's SQL never holds the user's names, so such names still fit
    and transform (vector features, stacked columns, a validation column), as they do without the setting."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    pixels = [f"px {i}" for i in range(64)]  # (VectorAssembler itself reads a dot in its inputCols as a field)
    df = (spark_local.createDataFrame(digits_pandas()).toDF(*pixels, "the label", "id")
          .withColumn("held out", F.col("id") % 5 == 0))
    df = VectorAssembler(inputCols=pixels, outputCol="img.features").transform(df)
    spark_local.conf.set("spark.sql.parser.quotedRegexColumnNames", "true")
    try:
        model = TorchEstimator(model=mlp(), featuresCol="img.features", labelCol="the label", loss="cross_entropy",
                               epochs=3, batchSize=64, learningRate=0.01, numProcesses=2,
                               validationCol="held out").fit(df)
        by_vector = model.transform(df).select("the label", "prediction").toPandas()
        by_columns = model.copy({model.featuresCol: pixels}).transform(df).select("prediction").toPandas()
    finally:
        spark_local.conf.unset("spark.sql.parser.quotedRegexColumnNames")
    assert model.history[-1]["val_loss"] < model.history[0]["val_loss"]
    assert (by_vector["prediction"] == by_vector["the label"]).mean() > 0.8
    np.testing.assert_array_equal(by_columns["prediction"].to_numpy(), by_vector["prediction"].to_numpy())


def test_copy_behaves_as_spark_expects():
    est = TorchEstimator(model=mlp(), learningRate=0.1, epochs=4)
    twin = est.copy({est.learningRate: 0.5, est.predictionCol: "p"})
    assert twin is not est and twin.uid == est.uid
    assert (twin.getLearningRate(), twin.getEpochs(), twin.getPredictionCol()) == (0.5, 4, "p")
    assert (est.getLearningRate(), est.getPredictionCol()) == (0.1, "prediction")
    assert twin.getModel() is est.getModel()  # Params are copied, not the values they hold
    assert twin.learningRate.parent == twin.uid
    model = TorchModel(model=mlp())
    other = model.copy({model.predictionCol: "q"})
    assert other.getPredictionCol() == "q" and model.getPredictionCol() == "prediction"
    assert est.extractParamMap()[est.loss] == "cross_entropy"


# -- bad input, before any training job -------------------------------------------------------------------
def bad_inputs(spark):
    from pyspark.sql import functions as F

    df = digits_arrays(spark)
    return {
        "model not set": (TorchEstimator(), df, "model is not set"),
        "missing feature column": (TorchEstimator(model=mlp(), featuresCol="pixels"), df, "featuresCol.*'pixels'"),
        "missing label column": (TorchEstimator(model=mlp(), labelCol="digit"), df, "labelCol.*'digit'"),
        "non-numeric feature column": (
            TorchEstimator(model=mlp(), featuresCol=["features", "name"]),
            df.withColumn("name", F.lit("x")), "featuresCol: column 'name' has type string"),
        "labels out of range": (TorchEstimator(model=mlp()), df.withColumn("label", F.col("label") + 1),
                                r"labelCol 'label' holds values from 1 to 10.*0\.\.9"),
        "too many processes": (TorchEstimator(model=mlp(), numProcesses=3), df, "numProcesses=3.*2 task slots"),
        "model and features disagree": (TorchEstimator(model=nn.Linear(10, 2)), df,
                                        r"model cannot take a \[batch, 64\]"),
        "model and feature columns disagree": (
            TorchEstimator(model=mlp(), featuresCol=["a", "b"]),
            df.withColumn("a", F.lit(1.0)).withColumn("b", F.lit(2)),
            r"model cannot take a \[batch, 2\]"),
        "fraction and column": (TorchEstimator(model=mlp(), validationFraction=0.1, validationCol="label"), df,
                                "validationCol='label' and validationFraction=0.1"),
        "null labels": (TorchEstimator(model=mlp()),
                        df.withColumn("label", F.when(F.col("label") != 3, F.col("label"))),
                        "labelCol: dataset 'train': column 'label' has 183 null values"),
        "NaN labels": (TorchEstimator(model=mlp()),
                       df.withColumn("label", F.when(F.col("label") != 3, F.col("label")).otherwise(float("nan"))),
                       "labelCol 'label' holds 183 NaN values"),
        "features of unequal width": (TorchEstimator(model=mlp()),
                                      df.withColumn("features", F.slice("features", 1, F.col("label") + 60)),
                                      "featuresCol: dataset 'train': column 'features' holds arrays of unequal "
                                      "length"),
        "no validation rows": (TorchEstimator(model=mlp(), validationCol="is_val"),
                               df.withColumn("is_val", F.col("label") > 9),
                               r"validationCol='is_val' \(the validation rows\): dataset 'val': the DataFrame is "
                               "empty"),
    }


def refused_fit_jobs(spark, est, df, message) -> list:
    """The Spark jobs of ``est.fit(df)``, which must raise a ConfigError matching ``message``: every job started
    meanwhile, whatever its group, as ``(job id, group)``; none of them a training job (a run's barrier job, under
    a job group ``spark_dist-...`` of its own)."""
    from spark_jobs import jobs_since, jobs_started, RUN_GROUP_PREFIX

    before = jobs_started(spark)
    with pytest.raises(ConfigError, match=message):
        est.fit(df)
    jobs = jobs_since(spark, before)
    assert not [job for job in jobs if job[1] is not None and job[1].startswith(RUN_GROUP_PREFIX)], jobs
    return jobs


@pytest.mark.parametrize("case", ["model not set", "missing feature column", "missing label column",
                                  "non-numeric feature column", "labels out of range", "too many processes",
                                  "model and features disagree", "model and feature columns disagree",
                                  "fraction and column", "null labels", "features of unequal width",
                                  "NaN labels",
                                  "no validation rows"])
def test_bad_input_is_named_before_any_training_job(spark_local, case):
    est, df, message = bad_inputs(spark_local)[case]
    jobs = refused_fit_jobs(spark_local, est, df, message)
    # Schema errors: no job at all. The others: only the job that writes the dataset cache and measures the
    # label range and feature width as it goes; never a training job.
    measured = ("labels out of range", "model and features disagree", "null labels", "features of unequal width",
                "NaN labels",
                "no validation rows")
    assert len(jobs) <= ((2 if case == "no validation rows" else 1) if case in measured else 0)


def test_bad_param_values_are_named():
    with pytest.raises(ConfigError, match="backend='mpi'"):
        TorchEstimator(backend="mpi")
    with pytest.raises(ConfigError, match="loss='hinge'"):
        TorchEstimator(loss="hinge")
    with pytest.raises(ConfigError, match="numProcesses=0"):
        TorchEstimator(numProcesses=0)
    with pytest.raises(TypeError, match="model"):
        TorchEstimator(model="not a module")
    with pytest.raises(ConfigError, match="validationFraction=1.5"):
        TorchEstimator().setValidationFraction(1.5)
    with pytest.raises(ConfigError, match="maxRetries=-1"):
        TorchEstimator(maxRetries=-1)


def test_transform_refuses_an_existing_output_column(spark_local):
    df = digits_arrays(spark_local).withColumnRenamed("label", "prediction")
    with pytest.raises(ConfigError, match="predictionCol.*'prediction'"):
        TorchModel(model=mlp()).transform(df)


# -- pieces --------------------------------------------------------------------------------------------
def test_old_and_new_ml_vectors_are_vectors_to_the_params_and_to_the_cache():
    from types import SimpleNamespace

    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT
    from pyspark.sql import types as T

    from spark_dist.data.schema import SCALAR, VECTOR, column_kinds
    from spark_dist.ml.inputs import column_kind

    schema = T.StructType([T.StructField("new", VectorUDT()), T.StructField("old", OldVectorUDT()),
                           T.StructField("x", T.DoubleType())])
    assert [column_kind(schema, c, "featuresCol") for c in schema.names] == [VECTOR, VECTOR, SCALAR]
    assert column_kinds("train", SimpleNamespace(schema=schema)) == {"new": VECTOR, "old": VECTOR, "x": SCALAR}


def test_linear_scaling_rule_ramps_over_the_warm_up():
    lrs = [learning_rate_at(s, 0.1, 4, warmup_steps=10, scale=True) for s in range(12)]
    assert lrs[0] == pytest.approx(0.13) and lrs[9] == pytest.approx(0.4) and lrs[11] == pytest.approx(0.4)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert learning_rate_at(0, 0.1, 4, 10, scale=False) == 0.1 and learning_rate_at(0, 0.1, 1, 10, True) == 0.1
    assert learning_rate_at(0, 0.1, 4, 0, True) == pytest.approx(0.4)
