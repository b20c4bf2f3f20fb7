"""spark_dist.ml.gradients: the estimator's DDP ranks average small CPU buckets of gradients by one all-gather.

The ranks run as local processes over gloo (``Distributor(local_mode=True)``): the hook needs torch.distributed,
not Spark.
"""
import torch

from spark_dist import Distributor
from spark_dist.ml.gradients import SMALL_BUCKET_BYTES, gathers


def test_small_cpu_buckets_gather_and_the_rest_keep_all_reduce():
    digits_mlp = torch.zeros(4810)  # the digits example's 64-64-10 MLP: one bucket of 4,810 floats
    assert gathers(digits_mlp, 2) and gathers(digits_mlp, 16)
    floats_for_two = SMALL_BUCKET_BYTES // 4 // 2
    assert gathers(torch.zeros(floats_for_two), 2)
    assert not gathers(torch.zeros(floats_for_two + 1), 2)  # every rank would hold too many copies
    assert not gathers(torch.zeros(10, device="meta"), 2)  # not on CPU (a GPU's tensors keep NCCL's all-reduce)


def train_both_ways(steps):
    """Each rank trains the same model on its own data twice, with DDP's all-reduce and with the hook; every
    rank's final weights of both, gathered."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from spark_dist.ml.gradients import average_small_buckets_by_all_gather

    dist.init_process_group("gloo")
    weights = {}
    for hooked in (False, True):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        start = torch.cat([p.detach().flatten() for p in module.parameters()])
        model = torch.nn.parallel.DistributedDataParallel(module)
        if hooked:
            model.register_comm_hook(None, average_small_buckets_by_all_gather)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(dist.get_rank())  # every rank its own batches
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        weights[hooked] = torch.cat([p.detach().flatten() for p in module.parameters()])
        weights[f"moved {hooked}"] = float((weights[hooked] - start).abs().max())
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, weights)
    dist.destroy_process_group()
    return everyone


def test_the_ranks_stay_equal_and_learn_what_ddps_all_reduce_teaches():
    rank0, rank1 = Distributor(num_processes=2, local_mode=True, verbose=False).run(train_both_ways, 20)
    for hooked in (False, True):
        assert torch.equal(rank0[hooked], rank1[hooked])  # the replicas never drift apart
        assert rank0[f"moved {hooked}"] > 0.01  # the gradients were applied
    assert torch.allclose(rank0[True], rank0[False], rtol=0, atol=1e-6)
