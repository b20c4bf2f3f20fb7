"""spark_dist.ml.gradients: a small CPU model's replicas learn without DDP what DDP teaches, bit for bit.

The ranks run as local processes over gloo (``Distributor(local_mode=True)``): the replicas need
torch.distributed, not Spark.
"""
import torch

from spark_dist import Distributor
from spark_dist.ml.gradients import ONE_BUCKET_BYTES, one_bucket


def gathered_and_ended(value):
    """Every rank's ``value``, in rank order; the process group destroyed."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    dist.destroy_process_group()
    return everyone


def replicas_against_ddp(steps):
    """Each rank trains a model with a BatchNorm layer on its own data, first as Replicas with the functional SGD
    the estimator gives them, then under DDP with torch.optim's SGD; what each gives, gathered from every rank."""
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from spark_dist.ml.gradients import Replicas, one_bucket
    from spark_dist.ml.optimizers import SGD

    dist.init_process_group("gloo")
    out = {}
    for kind in ("replicas", "ddp"):
        torch.manual_seed(dist.get_rank())  # the ranks start apart: rank 0's weights must reach everyone
        module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                     torch.nn.Linear(32, 4))
        out["one bucket"] = one_bucket(module.parameters())
        if kind == "replicas":
            model = Replicas(module)
            optimizer = SGD(module.parameters(), lr=0.1)
        else:
            model = torch.nn.parallel.DistributedDataParallel(module)
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(100 + dist.get_rank())  # every rank its own batches
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if kind == "replicas":
                model.average_gradients()
            optimizer.step()
        if kind == "replicas":  # DDP and torch.optim's classes import it; the replicas' training must not
            out["torch._dynamo after the replicas trained"] = "torch._dynamo" in sys.modules
        out[kind] = torch.cat([p.detach().flatten() for p in module.parameters()])
        out[f"{kind} buffers"] = torch.cat([b.detach().flatten().float() for b in module.buffers()])
    return gathered_and_ended(out)


def test_replicas_without_ddp_learn_bit_for_bit_what_ddp_teaches():
    rank0, rank1 = Distributor(num_processes=2, local_mode=True, verbose=False).run(replicas_against_ddp, 20)
    assert rank0["one bucket"]
    assert not rank0["torch._dynamo after the replicas trained"]  # what the replicas spare a fresh rank
    assert torch.equal(rank0["replicas"], rank1["replicas"])  # rank 0's start, its buffers, the same averages
    for rank in (rank0, rank1):  # the running statistics too: each rank's last forward pass updates its own
        assert torch.equal(rank["replicas"], rank["ddp"])
        assert torch.equal(rank["replicas buffers"], rank["ddp buffers"])
    assert not torch.equal(rank0["replicas buffers"], rank1["replicas buffers"])


def test_only_a_model_whose_gradients_make_one_ddp_bucket_skips_ddp():
    digits_mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    assert one_bucket(digits_mlp.parameters())
    assert one_bucket([torch.nn.Parameter(torch.zeros(ONE_BUCKET_BYTES // 4))])
    assert not one_bucket([torch.nn.Parameter(torch.zeros(ONE_BUCKET_BYTES // 4 + 1))])  # DDP's buckets overlap
    mixed = [*torch.nn.Linear(4, 2).parameters(), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    assert not one_bucket(mixed)  # one flat tensor holds one dtype
    frozen = torch.nn.Linear(4, 2).requires_grad_(False)
    assert not one_bucket(frozen.parameters())  # nothing to train
    assert not one_bucket(torch.nn.Linear(4, 2).to(torch.complex64).parameters())  # torch.optim's other kernels
