"""The campaign's ``estimator`` workload: ``TorchEstimator.fit`` on the DDP workload's rows (tests/chaos/workload.py:
4 features ``x``, a target ``y``), its ``transformFn`` in a worker process a rank, ``maxRetries=2``, then
``TorchModel.transform`` over the same rows. Its loss leaves the campaign's beacons and rank 0's steps as the DDP
workload's ranks do (the estimator's training loop is spark_dist's own), so the same faults find their targets.

What the docs promise under a lost rank, Python worker or transform worker (``TorchEstimator``'s ``maxRetries``):
the fit goes on from the last epoch that ended, to the model an uninterrupted fit gives, bit for bit; its
predictions are then the fault-free fit's too.
"""
import functools
import os
import time

from chaos.workload import BATCH, EPOCHS, STEP_S, beacon_of, stepped


def features(batch):
    """The ``transformFn``: the ``x`` column as the model's float input."""
    return batch["x"].float()


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


def estimator(beacons: str, epochs: int = EPOCHS, step_s: float = STEP_S):
    """The workload's estimator, its beacons in ``beacons``."""
    import torch
    from torch import nn

    from spark_dist.ml import TorchEstimator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return TorchEstimator(model=model, featuresCol="x", labelCol="y",
                          loss=functools.partial(beaconing_mse, beacons=beacons, step_s=step_s),
                          transformFn=features, transformWorkers=1, epochs=epochs, batchSize=BATCH,
                          learningRate=0.01, scaleLearningRate=False, numProcesses=2, maxRetries=2, seed=7)


def fitted(model, df) -> dict:
    """What a fit decided: the model's weights, its history, and its predictions of ``df``'s rows by id."""
    predictions = {r["id"]: r["prediction"] for r in model.transform(df).select("id", "prediction").collect()}
    return {"weights": {k: v.clone() for k, v in model.getModel().state_dict().items()},
            "history": list(model.history), "predictions": predictions}


def same_fit(got: dict, expected: dict) -> list:
    """How a fit's :func:`fitted` differs from the fault-free fit's: none of it may."""
    found = [f"weights {name} differ from the fault-free fit's" for name, tensor in expected["weights"].items()
             if not tensor.equal(got["weights"][name])]
    if got["history"] != expected["history"]:
        found.append(f"its history {got['history']} is not the fault-free fit's {expected['history']}")
    if got["predictions"] != expected["predictions"]:
        found.append("its predictions differ from the fault-free fit's")
    return found
