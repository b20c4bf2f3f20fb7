"""The campaign's ``sharded`` workload: the DDP workload's data and loader, the model sharded over the ranks with
FSDP2's ``fully_shard``, saved in the background as sharded checkpoints that keep the best by a score
(docs/large_models.md, "Retention"): ``keep=2``, ``metric="score"``, ``mode="min"``. Each save's score is drawn
from :data:`SCORES` by the save's place in the run (NaN and infinity among them: an epoch that diverged), so it is
the same however the run went, and the best is an early one that every later save must leave alone.

What the campaign checks of it after a success (tests/chaos/invariants.py, ``kept_the_best``): the final weights
are the fault-free run's, bit for bit, and ``Distributor.best_checkpoint`` names a checkpoint with the best score
whose weights are the fault-free run's best's. Its beacons and rank 0's steps are the DDP workload's.
"""
import math
import os
import time

from chaos.workload import BATCH, EPOCHS, EVERY, STEP_S, beacon_of, stepped, train_step

SCORES = (math.nan, 0.3, 0.5, math.nan, 0.6, 0.4, 0.7, math.inf, 0.8)  # a save's score, by its place in the run
KEEP = 2


def score_of(save: int) -> float:
    """The score rank 0 reports before save number ``save`` (0, 1, ...) of the run."""
    return SCORES[save % len(SCORES)]


def train(beacons, epochs=EPOCHS, step_s=STEP_S):
    """The rank's function: returns (every rank) the whole final weights, the attempt that finished and its
    number of ranks."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    beacon_of(beacons, ctx)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = ctx.loader("train", batch_size=BATCH, seed=7)
    state = {"model": model, "optimizer": optimizer, "loader": loader}
    ctx.load_checkpoint(into=state)
    steps = open(os.path.join(beacons, "steps"), "a") if ctx.rank == 0 else None
    per_epoch = len(loader)
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            at = loader.state_dict()["batches"]
            train_step(model, optimizer, batch)
            time.sleep(step_s)
            stepped(steps, ctx, epoch, at)
            if at % EVERY == 0:
                save = (epoch * per_epoch + at) // EVERY - 1
                if ctx.rank == 0:
                    ctx.report(score=score_of(save), save=save)
                ctx.save_checkpoint(state, async_save=True, keep=KEEP, metric="score", mode="min")
    weights = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return {"weights": weights, "attempt": ctx.attempt, "world_size": ctx.world_size}


def best_weights(path: str):
    """The model's whole weights in the sharded checkpoint at ``path`` (a ``best_checkpoint``)."""
    from spark_dist.task.sharded_checkpoints import load_full

    return load_full(path)["model"]
