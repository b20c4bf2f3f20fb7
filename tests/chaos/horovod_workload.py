"""The campaign's ``horovodrunner`` workload: a Horovod program run by ``spark_dist.HorovodRunner(np=2)`` as
Databricks' ``sparkdl.HorovodRunner`` runs it: ``hvd.init()``, ``hvd.DistributedOptimizer``, the parameters
broadcast from rank 0, each rank its own share of the DDP workload's rows (tests/chaos/workload.py: HorovodRunner
takes no datasets, so the program makes them, as a HorovodRunner program reads its own files). Its beacons and
rank 0's steps are the DDP workload's.

What the docs promise (HorovodRunner's docstring in spark_dist/dropins.py: no retries, as Databricks'): a rank
stopped for a moment costs nothing (the fault-free run's weights, every row once per epoch); a lost rank or
Python worker fails the run with a ``TrainingFailedError`` naming that rank (:data:`faults.HOROVOD_KINDS`).
"""
import math
import os
import time

from chaos.workload import BATCH, EPOCHS, ROWS, STEP_S, beacon_of, stepped


def rows_of(rank: int, size: int, epoch: int):
    """Rank ``rank``'s row ids of ``epoch``: every row once per epoch across the ranks, in an order drawn per
    epoch, in batches of BATCH."""
    import torch

    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
    return [order[i:i + BATCH] for i in range(rank * BATCH, ROWS, size * BATCH)]


def main(beacons, epochs=EPOCHS, step_s=STEP_S):
    """Every rank's function: returns (rank 0) the weights, each epoch's row ids as the ranks trained them, the
    attempt and the number of ranks, as the DDP workload does."""
    import horovod.torch as hvd
    import torch
    from torch import nn

    from spark_dist import get_context

    hvd.init()
    ctx = get_context()
    beacon_of(beacons, ctx)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = open(os.path.join(beacons, "steps"), "a") if hvd.rank() == 0 else None
    lineage = {}
    for epoch in range(epochs):
        trained = []
        for at, ids in enumerate(rows_of(hvd.rank(), hvd.size(), epoch), start=1):
            x = torch.tensor([[math.sin(i * k) for k in (1, 2, 3, 4)] for i in ids])
            y = torch.tensor([math.cos(i) for i in ids])
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x).squeeze(1), y).backward()
            optimizer.step()
            trained += ids
            time.sleep(step_s)
            stepped(steps, ctx, epoch, at)
        lineage[epoch] = [i for ids in hvd.allgather_object(trained) for i in ids]
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hvd.shutdown()
    return {"weights": weights, "lineage": lineage, "attempt": ctx.attempt, "world_size": ctx.world_size}
