"""PySpark's TorchDistributor documentation example, file form (made runnable: a concrete model and data)."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(learning_rate, batch_size, use_gpu=False):
    backend = "nccl" if use_gpu else "gloo"
    dist.init_process_group(backend)
    device = int(os.environ["LOCAL_RANK"]) if use_gpu else "cpu"
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = DDP(torch.nn.Linear(8, 2).to(device))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    weights = model.module.weight.detach().clone()
    dist.destroy_process_group()
    return weights


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, required=True)
    parser.add_argument("--batch_size", type=int, required=True)
    args = parser.parse_args()
    weights = train(args.learning_rate, args.batch_size)
    # Not in the documented example: leave each rank's weights next to this file for the test to compare.
    torch.save(weights, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"rank{os.environ['RANK']}.pt"))
