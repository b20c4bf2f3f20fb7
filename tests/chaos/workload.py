"""The campaign's workload: DDP over a DataFrame through ``ctx.loader``, a checkpoint every few batches (mid-epoch,
the loader's place in it), deterministic on CPU, so that every ending can be checked against a fault-free run:
the final weights bit for bit, and the rows each epoch trained (each row carries its id).

What the ranks leave for the campaign, in ``beacons`` (a directory on the driver's machine): each rank's pid and
its parent's (the task's Python worker) as it starts an attempt, ``a<attempt>-r<rank>.json``; and rank 0's
training steps, a line of ``<attempt> <epoch> <batch> <time>`` each, in ``steps``.
"""
import json
import os
import time

ROWS, EPOCHS, BATCH, EVERY = 192, 3, 8, 4  # 12 batches a rank and epoch over 2 ranks; a checkpoint every 4
STEPS = EPOCHS * ROWS // (2 * BATCH)  # a rank's training steps in a run
STEP_S = 0.02  # a step's extra time: a fault drawn at a random time lands mid-training


def dataset(spark):
    """ROWS rows: an id, 4 features and a target, in 3 partitions of unequal sizes."""
    from pyspark.sql import functions as F

    return spark.range(0, ROWS, numPartitions=3).select(
        F.col("id"), F.array(*[F.sin(F.col("id") * k) for k in (1, 2, 3, 4)]).alias("x"),
        F.cos(F.col("id")).alias("y"))


def _beacon(beacons, ctx):
    path = os.path.join(beacons, f"a{ctx.attempt}-r{ctx.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "host": ctx.host, "time": time.time()}, f)
    os.replace(path + ".tmp", path)


def train(beacons):
    """The rank's function: returns (rank 0) the weights, each epoch's row ids as trained in the lineage that
    led to them (across attempts, from the checkpoints), and the attempt that finished."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    _beacon(beacons, ctx)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = ctx.loader("train", batch_size=BATCH, seed=7)
    lineage = {}  # epoch -> row ids trained, every rank's, up to the last checkpoint (rank 0's copy counts)
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        lineage = state["lineage"]
    pending = {}  # epoch -> this rank's row ids since the last checkpoint
    steps = open(os.path.join(beacons, "steps"), "a") if ctx.rank == 0 else None

    def settle():
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, pending)
        for ranks_ids in gathered:
            for epoch, ids in ranks_ids.items():
                lineage.setdefault(epoch, []).extend(ids)
        pending.clear()

    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            at = loader.state_dict()["batches"]
            optimizer.zero_grad()
            nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"]).backward()
            optimizer.step()
            pending.setdefault(epoch, []).extend(batch["id"].tolist())
            time.sleep(STEP_S)
            if steps is not None:
                steps.write(f"{ctx.attempt} {epoch} {at} {time.time()}\n")
                steps.flush()
            if at % EVERY == 0:
                settle()
                ctx.save_checkpoint({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                     "loader": loader.state_dict(), "lineage": lineage})
    settle()
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return {"weights": weights, "lineage": lineage, "attempt": ctx.attempt}
