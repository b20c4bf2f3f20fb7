"""TorchEstimator(maxRetries=n) on local[2]: a fit that loses the Python worker under a rank mid-epoch (its Spark
task lost) goes on from the last epoch that ended and gives the model an uninterrupted fit gives, bit for
bit, with one history; without maxRetries the same loss fails the fit, naming the rank."""
import functools
import os
import signal

import pytest
import torch
from torch import nn

from spark_dist import TrainingFailedError, get_context
from spark_dist.ml import TorchEstimator
from test_ml import digits_arrays, mlp

EPOCHS, BATCH = 3, 64  # 1,797 rows over 2 ranks: 14 whole batches a rank and epoch
KILL_AT = 14 + 7  # rank 1's 21st step: the 7th batch of epoch 1, after epoch 0's checkpoint


def cross_entropy(output, label, kill=None, steps=None):
    """The loss; ``kill`` ("rank" or "python worker"): on the first attempt, rank 1 SIGKILLs itself or its
    Python worker at its :data:`KILL_AT`-th step. ``steps``: a directory where each rank counts its steps per
    attempt (a file ``a<attempt>-r<rank>``)."""
    ctx = get_context()
    calls = cross_entropy.calls = getattr(cross_entropy, "calls", 0) + 1
    if steps is not None:
        with open(os.path.join(steps, f"a{ctx.attempt}-r{ctx.rank}"), "w") as f:
            f.write(str(calls))
    if kill is not None and ctx.attempt == 0 and ctx.rank == 1 and calls == KILL_AT:
        os.kill(os.getpid() if kill == "rank" else os.getppid(), signal.SIGKILL)
    return nn.functional.cross_entropy(output, label)


def fit(df, kill=None, retries=1, steps=None):
    est = TorchEstimator(model=mlp(), loss=functools.partial(cross_entropy, kill=kill, steps=steps),
                         epochs=EPOCHS, batchSize=BATCH, learningRate=0.01, numProcesses=2, maxRetries=retries)
    return est.fit(df)


def test_a_fit_that_lost_a_python_worker_goes_on_from_its_last_epoch_to_the_same_model(spark_local, tmp_path):
    # A Python worker lost with its Spark task: a lost rank alone is retried alike (Distributor's rule; the fault
    # campaign's estimator workload kills ranks, Python workers and transform workers: bench/bench_chaos.py).
    df = digits_arrays(spark_local)
    expected = fit(df, retries=0)  # no checkpoints at all: they change nothing
    model = fit(df, kill="python worker", steps=str(tmp_path))
    # The retry trained epochs 1 and 2 only (14 steps each on each rank), after epoch 0's checkpoint: not 42.
    assert sorted(os.listdir(tmp_path)) == ["a0-r0", "a0-r1", "a1-r0", "a1-r1"]
    assert [(tmp_path / f"a1-r{r}").read_text() for r in (0, 1)] == ["28", "28"]
    assert [r["epoch"] for r in model.history] == list(range(EPOCHS))
    assert model.history == expected.history
    for name, tensor in expected.getModel().state_dict().items():
        assert torch.equal(tensor, model.getModel().state_dict()[name]), name


def test_without_max_retries_the_lost_rank_fails_the_fit_naming_it(spark_local):
    with pytest.raises(TrainingFailedError) as failed:
        fit(digits_arrays(spark_local), kill="rank", retries=0)
    assert "rank 1 on host 127.0.0.1" in str(failed.value)
