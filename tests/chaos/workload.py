"""The campaign's workload: DDP over a DataFrame through ``ctx.loader``, a checkpoint every few batches (mid-epoch,
the loader's place in it), deterministic on CPU, so that every ending can be checked against a fault-free run:
the final weights bit for bit, and the rows each epoch trained (each row carries its id). The same function is
the campaign's three workloads: ``ddp`` (a fixed size), ``elastic`` (run with ``min_processes=1``: an attempt
may run on one rank, the rest of an epoch dealt out to it, and grow back to two at a checkpoint; see
docs/elastic.md) and ``transform`` (``workers=1``: every batch passes through a transform worker process, whose
transform changes nothing, so the run trains what ``ddp`` does: docs/data.md, "A transform in worker processes").
Its length is the run's: ``epochs`` and ``step_s`` (a step's extra time), the defaults below unless a campaign
gives others (:func:`steps` counts them).

What the ranks leave for the campaign, in ``beacons`` (a directory on the driver's machine): each rank's pid and
its parent's (the task's Python worker) as it starts an attempt, ``a<attempt>-r<rank>.json``; and rank 0's
training steps, a line of ``<attempt> <epoch> <batch> <time>`` each, in ``steps``. What a fault leaves for the
ranks there: ``hold-for-notice`` (a deadline, as ``time.time()``), where the fault is one the driver tells the
ranks of (a decommission: the driver looks every 2 s, and a run of the campaign's length may be over by then):
each rank of the first attempt then waits after its step until it has heard the notice (``ctx.preempted``) or
the deadline passed, as a longer training would go on meanwhile.
"""
import json
import os
import time

ROWS, EPOCHS, BATCH, EVERY = 192, 3, 8, 4  # 12 batches a rank and epoch over 2 ranks; a checkpoint every 4
RANKS = 2
STEP_S = 0.02  # a step's extra time: a fault drawn at a random time lands mid-training
# On the standalone cluster (the suite's run and `bench_chaos.py --cluster standalone`): two epochs, for the suite's
# time, of longer steps, so that a run's training outlasts the driver's look for decommissions (every 2 s) after a
# fault drawn late in it, most of the time.
STANDALONE_EPOCHS, STANDALONE_STEP_S = 2, 0.05
HOLD_FOR_NOTICE = "hold-for-notice"


def steps(epochs: int = EPOCHS) -> int:
    """A rank's training steps in a run of ``epochs`` on :data:`RANKS` ranks. Every checkpoint of such a run is at
    an even place of its epoch (``EVERY`` steps of two ranks), and so is every one of an attempt on one rank (an
    elastic run's): what is left of an epoch always divides among two ranks again, so an elastic run that grows
    back trains every row of the epoch once (docs/elastic.md: where the new ranks do not divide what is left, a
    loader repeats or leaves out a few batches)."""
    return epochs * ROWS // (RANKS * BATCH)


STEPS = steps()  # a rank's training steps in a run of the default length


def dataset(spark):
    """ROWS rows: an id, 4 features and a target, in 3 partitions of unequal sizes."""
    from pyspark.sql import functions as F

    return spark.range(0, ROWS, numPartitions=3).select(
        F.col("id"), F.array(*[F.sin(F.col("id") * k) for k in (1, 2, 3, 4)]).alias("x"),
        F.cos(F.col("id")).alias("y"))


def beacon_of(beacons, ctx):
    """The rank's beacon for this attempt: its pid, its parent's, its host and the time it started."""
    path = os.path.join(beacons, f"a{ctx.attempt}-r{ctx.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "host": ctx.host, "time": time.time()}, f)
    os.replace(path + ".tmp", path)


def train_step(model, optimizer, batch) -> None:
    """One optimizer step of the regression on ``batch``."""
    from torch import nn

    optimizer.zero_grad()
    nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"]).backward()
    optimizer.step()


def stepped(steps, ctx, epoch: int, at: int) -> None:
    """Rank 0's line in ``steps`` for a step done (``steps``: its open file; None on the other ranks):
    ``attempt epoch step time pid`` (the pid tells a run again from the interrupted one, both at attempt 0)."""
    if steps is not None:
        steps.write(f"{ctx.attempt} {epoch} {at} {time.time()} {os.getpid()}\n")
        steps.flush()


def weight_score(model) -> float:
    """The sum of the model's absolute weights: a number its training decides bit for bit."""
    return float(sum(p.detach().abs().sum() for p in model.parameters()))


def unchanged(batch):
    """The ``transform`` workload's transform: the batch as it came, through a worker process and back."""
    return batch


def train(beacons, epochs=EPOCHS, step_s=STEP_S, workers=0, lr=0.01, report=None):
    """The rank's function: returns (rank 0) the weights, each epoch's row ids as trained in the lineage that
    led to them (across attempts, from the checkpoints, whatever number of ranks each attempt had), the attempt
    that finished and its number of ranks. ``lr``: Adam's learning rate; ``report``: a metric name rank 0
    reports at each epoch's end with the epoch, its value :func:`weight_score` (the tuning workload's)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    beacon_of(beacons, ctx)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    through_workers = {"transform": unchanged, "workers": workers} if workers else {}
    loader = ctx.loader("train", batch_size=BATCH, seed=7, **through_workers)
    lineage = {}  # epoch -> row ids trained, every rank's, up to the last checkpoint (rank 0's copy counts)
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        lineage = state["lineage"]
    pending = {}  # epoch -> this rank's row ids since the last checkpoint
    steps = open(os.path.join(beacons, "steps"), "a") if ctx.rank == 0 else None
    hold = os.path.join(beacons, HOLD_FOR_NOTICE)

    def wait_for_notice():
        if ctx.attempt or not os.path.exists(hold):
            return
        with open(hold) as f:
            deadline = float(f.read())
        while not ctx.preempted and time.time() < deadline:
            time.sleep(0.05)

    def settle():
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, pending)
        for ranks_ids in gathered:
            for epoch, ids in ranks_ids.items():
                lineage.setdefault(epoch, []).extend(ids)
        pending.clear()

    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            at = loader.state_dict()["batches"]
            train_step(model, optimizer, batch)
            pending.setdefault(epoch, []).extend(batch["id"].tolist())
            time.sleep(step_s)
            wait_for_notice()
            stepped(steps, ctx, epoch, at)
            if at % EVERY == 0:
                settle()
                ctx.save_checkpoint({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                     "loader": loader.state_dict(), "lineage": lineage})
        if report is not None and ctx.rank == 0:
            ctx.report(epoch=epoch, **{report: weight_score(model.module)})
    settle()
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return {"weights": weights, "lineage": lineage, "attempt": ctx.attempt, "world_size": ctx.world_size}
