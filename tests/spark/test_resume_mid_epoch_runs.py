"""A rank killed mid-epoch is retried from a checkpoint holding ``loader.state_dict()``: the retry goes on at the
exact next batch, and the run ends with the weights of an uninterrupted one (issue #40, item 3). Here with a
transform in worker processes, whose random draws must repeat too; the plain loader's case is the fault
campaign's (tests/chaos: SIGKILL at a drawn time, identical weights, every row once per epoch)."""
import os
import signal

import pytest

from spark_dist import Distributor, get_context

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

EPOCHS, BATCH, EVERY = 2, 8, 5  # 200 rows over 2 ranks: 12 batches of 8 a rank and epoch; a checkpoint every 5
KILL_AT = (1, 7)  # (epoch, batch): rank 1 dies there on the first attempt, two batches after a checkpoint


def noisy(batch):
    """A random augmentation: seeded per (seed, epoch, batch) by the loader, so a retry sees the same noise."""
    import torch

    return {"x": batch["x"] + 0.01 * torch.randn_like(batch["x"]), "y": batch["y"]}


def train_resumable(kill):
    """DDP over the "train" dataset through a random transform in a worker process, checkpointing model,
    optimizer and loader every EVERY batches; ``kill``: rank 1 dies at KILL_AT on the first attempt."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    ctx = get_context()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = ctx.loader("train", batch_size=BATCH, seed=7, transform=noisy, workers=1)
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # the next iteration yields the batches after the saved ones
    resumed_at = None if state is None else (state["loader"]["epoch"], state["loader"]["batches"])
    trained = 0
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)  # keeps a restored position in its own epoch
        for batch in loader:
            at = loader.state_dict()["batches"]  # batches yielded in this epoch, this one included
            if kill and ctx.attempt == 0 and ctx.rank == 1 and (epoch, at) == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"]).backward()
            optimizer.step()
            trained += 1
            if at % EVERY == 0:
                ctx.save_checkpoint({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                     "loader": loader.state_dict()})
                dist.barrier()  # for the test: rank 0's checkpoint is on disk before rank 1 can die
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return {"weights": weights, "attempt": ctx.attempt, "resumed_at": resumed_at, "trained": trained}


def test_a_rank_killed_mid_epoch_resumes_at_the_next_batch_with_identical_weights(spark_local, tmp_path):
    df = spark_local.range(0, 200, numPartitions=3).select(
        F.array(*[F.sin(F.col("id") * k) for k in (1, 2, 3, 4)]).alias("x"),
        F.cos(F.col("id")).alias("y"))
    clean = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "clean"))
    expected = clean.run(train_resumable, False, datasets={"train": df})
    retried = Distributor(num_processes=2, max_retries=1, verbose=False, checkpoint_dir=str(tmp_path / "killed"))
    out = retried.run(train_resumable, True, datasets={"train": df})
    assert expected["attempt"] == 0 and expected["resumed_at"] is None and expected["trained"] == EPOCHS * 12
    assert out["attempt"] == 1 and out["resumed_at"] == (1, 5)  # mid-epoch: the last checkpoint before the kill
    assert out["trained"] == 12 - 5  # the rest of epoch 1 only, nothing trained twice
    assert expected["weights"].keys() == out["weights"].keys()
    for name, tensor in expected["weights"].items():
        assert tensor.equal(out["weights"][name]), name
