"""FSDP2 under spark_dist: a model sharded over the ranks with ``fully_shard``, fed by ``ctx.loader``, with
sharded checkpoints that a retried or resumed run (on as many ranks, or on fewer) goes on from exactly.

    # a function: Distributor(num_processes=2, max_retries=1).run(train, 4, datasets={"train": df})
    # a script:   TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, max_retries=1)
    #                 .run_with_datasets({"train": df}, "train_fsdp.py", "--epochs", "4", "--out", "/tmp/w.pt")

The "train" dataset has an array column ``x`` (4 floats) and a float ``y``. Every ``every`` batches and at each
epoch's end every rank calls ``ctx.save_checkpoint`` with the live model, optimizer and loader: each writes its
own shards. docs/large_models.md walks through it.
"""
import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn

from spark_dist import get_context


def sharded_model(world_size: int, device: torch.device) -> nn.Module:
    """The same initial weights on every rank (seeded), each Linear and the whole model sharded over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(epochs: int, batch_size: int = 8, every: int = 5, lr: float = 0.01, kill_at=None, async_save=False):
    """Train ``epochs`` epochs in all (a resumed run does the rest). ``kill_at=(epoch, batch)``: rank 1 of the
    first attempt dies there, for the tests. Returns the whole weights, where the run resumed and each epoch's
    loss (also reported as ``loss`` with its ``epoch``)."""
    ctx = get_context()
    dist.init_process_group("nccl" if ctx.use_gpu else "gloo")
    if ctx.use_gpu:
        torch.cuda.set_device(ctx.device)
    model = sharded_model(ctx.world_size, ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loader = ctx.loader("train", batch_size=batch_size, seed=7)
    state = {"model": model, "optimizer": optimizer, "loader": loader}
    resumed_at = None
    if ctx.load_checkpoint(into=state) is not None:  # restores the three in place, resharded to this world size
        resumed_at = (loader.epoch, loader.state_dict()["batches"])
    losses = {}
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)  # keeps a restored place in its own epoch
        total, steps = torch.zeros(2, device=ctx.device), 0
        for batch in loader:
            at = loader.state_dict()["batches"]  # batches yielded in this epoch, this one included
            if kill_at is not None and ctx.attempt == 0 and ctx.rank == 1 and (epoch, at) == tuple(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(batch["x"].to(ctx.device)).squeeze(1), batch["y"].to(ctx.device))
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach(), torch.ones((), device=ctx.device)])
            steps += 1
            if at % every == 0 or at == len(loader):
                ctx.save_checkpoint(state, async_save=async_save)
        if steps:  # a run resumed at an epoch's end has none left in it
            dist.all_reduce(total)
            losses[epoch] = float(total[0] / total[1])
            ctx.report(epoch=epoch, loss=losses[epoch])
    weights = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}  # a collective: every rank
    dist.destroy_process_group()
    return {"weights": weights, "attempt": ctx.attempt, "resumed_at": resumed_at, "losses": losses,
            "world_size": ctx.world_size}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--kill-at", type=int, nargs=2, default=None, metavar=("EPOCH", "BATCH"))
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--out", help="rank 0 saves what train() returns here (torch.save)")
    args = p.parse_args()
    result = train(args.epochs, args.batch_size, args.every, kill_at=args.kill_at, async_save=args.async_save)
    if args.out and result is not None and get_context().rank == 0:
        torch.save(result, args.out)


if __name__ == "__main__":
    main()
