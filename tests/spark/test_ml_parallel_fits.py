"""CrossValidator and TrainValidationSplit with ``parallelism=n`` over TorchEstimator: the fits run at once, each
its own barrier job (fits beyond the slots wait their turn), and give the same results as ``parallelism=1``."""
import os
import time

from spark_dist.ml import TorchEstimator
from test_ml import digits_pandas, mlp

PIXELS = [f"p{i}" for i in range(64)]


def digits(spark, rows):
    from pyspark.sql import functions as F

    df = spark.createDataFrame(digits_pandas().head(rows))
    return df.select(F.array(*PIXELS).cast("array<float>").alias("features"), "label")


def timed_adam(log_dir):
    """Adam that notes, per rank process, when it stepped (which fits overlapped), and steps slowly."""
    def make(parameters, lr):
        import torch

        class TimedAdam(torch.optim.Adam):
            def step(self, closure=None):
                with open(os.path.join(log_dir, str(os.getpid())), "a") as f:
                    f.write(f"{time.time()}\n")
                time.sleep(0.05)  # a step long enough for two fits' training to overlap visibly
                return super().step(closure)
        return TimedAdam(parameters, lr=lr)
    return make


def overlapping_fits(log_dir):
    spans = []
    for name in os.listdir(log_dir):
        times = [float(t) for t in open(os.path.join(log_dir, name)).read().split()]
        spans.append((min(times), max(times)))
    spans.sort()
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:]) if start < end)


def test_cross_validator_fits_at_once_with_the_results_of_one_at_a_time(spark_local, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    df = digits(spark_local, 400).cache()
    results = {}
    for parallelism in (1, 2):
        log_dir = tmp_path / f"p{parallelism}"
        log_dir.mkdir()
        est = TorchEstimator(model=mlp(), epochs=2, batchSize=64, numProcesses=1, optimizer=timed_adam(str(log_dir)))
        grid = ParamGridBuilder().addGrid(est.learningRate, [1e-4, 0.01]).build()
        cv = CrossValidator(estimator=est, estimatorParamMaps=grid, numFolds=2, seed=3, parallelism=parallelism,
                            evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
        model = cv.fit(df)
        results[parallelism] = (model.avgMetrics, model.bestModel.history, overlapping_fits(str(log_dir)))
    (metrics1, history1, overlaps1), (metrics2, history2, overlaps2) = results[1], results[2]
    assert overlaps1 == 0 and overlaps2 >= 1  # one fit at a time, then two at once on the two slots
    assert metrics2 == metrics1 and metrics1[1] > metrics1[0]
    assert [h["train_loss"] for h in history2] == [h["train_loss"] for h in history1]
    assert spark_local.sparkContext.statusTracker().getActiveJobsIds() == []


def test_train_validation_split_with_more_parallel_fits_than_slots(spark_local):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    df = digits(spark_local, 400).cache()
    metrics = {}
    for parallelism in (1, 3):  # three fits of two ranks each on two slots: they take turns
        est = TorchEstimator(model=mlp(), epochs=1, batchSize=64, numProcesses=2)
        grid = ParamGridBuilder().addGrid(est.learningRate, [1e-4, 3e-3, 0.01]).build()
        tvs = TrainValidationSplit(estimator=est, estimatorParamMaps=grid, trainRatio=0.75, seed=5,
                                   parallelism=parallelism,
                                   evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
        metrics[parallelism] = tvs.fit(df).validationMetrics
    assert metrics[3] == metrics[1]
