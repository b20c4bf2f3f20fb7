"""A plain torchrun training script: nothing in it knows about Spark or spark_dist.

    torchrun --nproc_per_node=2 train_ddp.py --snapshot /tmp/snap.pt --epochs 4
    spark-dist run --num-processes 2 train_ddp.py --snapshot /tmp/snap.pt --epochs 4

Each rank reads its place from the torchrun variables, trains a linear model with DDP on its
DistributedSampler shard of a synthetic regression set, and rank 0 saves a snapshot after every
epoch. A later run with the same --snapshot resumes from it (as torchrun's elastic restarts do).
The snapshot also keeps what happened (losses, world size, where each run started), which the
tests read to check the training really ran.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True, help="file rank 0 saves to and every rank resumes from")
    p.add_argument("--epochs", type=int, default=3, help="train until this many epochs are done in total")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args()


def synthetic_data(n=512, features=8):
    """The same data on every rank (fixed seed): y = x @ w + small noise."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    w = torch.arange(1.0, features + 1).unsqueeze(1) / features
    return TensorDataset(x, x @ w + 0.01 * torch.randn(n, 1, generator=g))


def load_snapshot(path):
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu")


def save_snapshot(path, state):
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a rank killed mid-save never leaves half a snapshot


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    # No backend argument: torch picks gloo for CPU tensors (and NCCL for CUDA ones).
    dist.init_process_group()
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")

    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    snapshot = load_snapshot(args.snapshot)
    history = {"losses": [], "starts": [], "world_sizes": []}
    start_epoch = 0
    if snapshot is not None:
        model.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        start_epoch, history = snapshot["epoch"], snapshot["history"]
        if rank == 0:
            print(f"resuming from epoch {start_epoch} of {args.snapshot}", flush=True)
    history["starts"].append(start_epoch)
    history["world_sizes"].append(world_size)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)

    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.MSELoss()
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(total)  # the epoch's mean loss over every rank's shard
        mean_loss = (total[0] / total[1]).item()
        history["losses"].append(mean_loss)
        if rank == 0:
            print(f"epoch {epoch} loss {mean_loss:.5f} (world size {world_size})", flush=True)
            save_snapshot(args.snapshot, {"epoch": epoch + 1, "model": model.state_dict(),
                                          "optimizer": optimizer.state_dict(), "history": history})
        dist.barrier()  # nobody starts the next epoch (or exits) before the snapshot is on disk
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
