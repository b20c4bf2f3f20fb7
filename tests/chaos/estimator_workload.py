"""The campaign's ``estimator`` workload: ``TorchEstimator.fit`` on JPEG bytes (one small grey image a row of the
DDP workload's ids, drawn from the id, and its target ``y``), decoded by its ``transformFn`` in a worker process a
rank, ``maxRetries=2``; then ``TorchModel.transform`` and spark_dist's ``predict_batch_udf`` over the same rows. Its
loss leaves the campaign's beacons and rank 0's steps as the DDP workload's ranks do (the estimator's training
loop is spark_dist's own), so the same faults find their targets.

What the docs promise under a lost rank, Python worker or transform worker (``TorchEstimator``'s ``maxRetries``):
the fit goes on from the last epoch that ended, to the model an uninterrupted fit gives, bit for bit; its
predictions, by the model's transform and by a ``predict_batch_udf`` of its weights, are then the fault-free
fit's too.
"""
import functools
import io
import os
import sys
import time

from chaos.workload import BATCH, EPOCHS, ROWS, STEP_S, beacon_of, stepped

SIDE = 8  # the images' width and height, in pixels


def jpeg_of(row_id: int) -> bytes:
    """Row ``row_id``'s image: a grey gradient whose slope and offset the id decides, as JPEG bytes."""
    import numpy as np
    from PIL import Image

    ramp = np.add.outer(np.arange(SIDE), np.arange(SIDE)) * (row_id % 7 + 1) + 3 * row_id
    out = io.BytesIO()
    Image.fromarray((ramp % 256).astype(np.uint8), mode="L").save(out, format="JPEG", quality=90)
    return out.getvalue()


def images(spark):
    """The workload's rows: ``id``, ``content`` (JPEG bytes) and ``y`` (the DDP workload's target), in 3
    partitions."""
    import math

    rows = [(i, jpeg_of(i), float(math.cos(i))) for i in range(ROWS)]
    return spark.createDataFrame(rows, "id long, content binary, y float").repartition(3, "id")


def pixels(batch):
    """The ``transformFn`` (and the predict function's decoding): JPEG bytes -> ``[rows, SIDE * SIDE]`` floats."""
    import numpy as np
    import torch
    from PIL import Image

    decoded = [np.asarray(Image.open(io.BytesIO(bytes(b))), dtype=np.float32).reshape(-1) / 255.0
               for b in batch["content"]]
    return torch.from_numpy(np.stack(decoded))


def beaconing_mse(output, label, beacons, step_s):
    """The loss: mean squared error; first, the rank's beacon for its attempt and (rank 0) a line for its step,
    then ``step_s`` more seconds, so that a fault drawn at a random time lands mid-training."""
    import torch

    from spark_dist import get_context

    ctx = get_context()
    if not os.path.exists(os.path.join(beacons, f"a{ctx.attempt}-r{ctx.rank}.json")):  # the attempt's first step
        beacon_of(beacons, ctx)
        beaconing_mse.steps = open(os.path.join(beacons, "steps"), "a") if ctx.rank == 0 else None
        beaconing_mse.count = 0
    beaconing_mse.count += 1
    stepped(beaconing_mse.steps, ctx, 0, beaconing_mse.count)
    time.sleep(step_s)
    return torch.nn.functional.mse_loss(output.squeeze(1), label)


def model():
    from torch import nn

    return nn.Sequential(nn.Linear(SIDE * SIDE, 8), nn.Tanh(), nn.Linear(8, 1))


def estimator(beacons: str, epochs: int = EPOCHS, step_s: float = STEP_S):
    """The workload's estimator, its beacons in ``beacons``."""
    import torch

    from spark_dist.ml import TorchEstimator

    torch.manual_seed(0)
    return TorchEstimator(model=model(), featuresCol="content", labelCol="y",
                          loss=functools.partial(beaconing_mse, beacons=beacons, step_s=step_s),
                          transformFn=pixels, inferenceTransformFn=pixels, transformWorkers=1, epochs=epochs,
                          batchSize=BATCH, learningRate=0.01, scaleLearningRate=False, numProcesses=2, maxRetries=2,
                          seed=7)


def predictor(weights):
    """``predict_batch_udf``'s ``make_predict_fn`` for a model of these weights: JPEG bytes in, a float out."""
    def make_predict_fn():
        import torch

        net = model()
        net.load_state_dict(weights)
        net.eval()

        def predict(content):
            with torch.no_grad():
                return net(pixels({"content": content})).squeeze(1).numpy()
        return predict
    return make_predict_fn


def fitted(fit, df) -> dict:
    """What a fit decided: the model's weights, its history, its predictions of ``df``'s rows by id, and those of
    a ``predict_batch_udf`` of its weights."""
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from spark_dist import predict_batch_udf

    weights = {k: v.clone() for k, v in fit.getModel().state_dict().items()}
    predictions = {r["id"]: r["prediction"] for r in fit.transform(df).select("id", "prediction").collect()}
    udf = predict_batch_udf(predictor(weights), return_type="float", batch_size=BATCH)
    # Spark pickles the UDF by reference to this module, which Spark's Python workers cannot import (tests/ is not
    # on their path): by value, as a notebook's own functions travel.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        by_udf = {r["id"]: r["p"] for r in df.select("id", udf(F.col("content")).alias("p")).collect()}
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return {"weights": weights, "history": list(fit.history), "predictions": predictions, "by_udf": by_udf}


def same_fit(got: dict, expected: dict) -> list:
    """How a fit's :func:`fitted` differs from the fault-free fit's: none of it may."""
    found = [f"weights {name} differ from the fault-free fit's" for name, tensor in expected["weights"].items()
             if not tensor.equal(got["weights"][name])]
    if got["history"] != expected["history"]:
        found.append(f"its history {got['history']} is not the fault-free fit's {expected['history']}")
    if got["predictions"] != expected["predictions"]:
        found.append("its model's transform predicts otherwise than the fault-free fit's")
    if got["by_udf"] != expected["by_udf"]:
        found.append("predict_batch_udf with its weights predicts otherwise than with the fault-free fit's")
    return found
