"""How the estimator's DDP ranks average their gradients on CPU: small buckets by one all-gather, not all-reduce.

Gloo's all-reduce of a tensor on CPU runs a reduce-scatter, then an all-gather: two rounds of messages whatever
the tensor's size. For a small tensor that latency is the cost: on this project's 2-core machine, about 2 ms for
100 to 100,000 floats between two ranks, against about 1 ms for an all-gather of the same floats (BENCHMARKS.md,
Spark ML). A model small enough to train on CPU in a Spark job often has one or two such buckets, so every step
waits on it. Where every rank can hold ``world_size`` copies of a bucket (at most :data:`SMALL_BUCKET_BYTES`
together), each rank gathers the others' gradients in one round and sums them in rank order: every rank computes
the same average from the same numbers, in the same order, so the replicas stay equal. Larger buckets and GPU
tensors keep DDP's all-reduce, whose traffic does not grow with the number of ranks.
"""
import torch  # no `from __future__ import annotations`: DDP checks the hook's annotations as objects
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

SMALL_BUCKET_BYTES = 1 << 20  # a bucket's world_size copies, together


def gathers(tensor: torch.Tensor, world_size: int) -> bool:
    """Whether a bucket of gradients goes by all-gather: on CPU, its ``world_size`` copies within
    :data:`SMALL_BUCKET_BYTES`."""
    return tensor.device.type == "cpu" and tensor.numel() * tensor.element_size() * world_size <= SMALL_BUCKET_BYTES


def average_small_buckets_by_all_gather(process_group,
                                        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook (``model.register_comm_hook(None, this)``): the bucket's gradients averaged over
    the ranks, by one all-gather for a small CPU bucket, else by DDP's own all-reduce (``allreduce_hook``)."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    world_size = dist.get_world_size(group)
    if not gathers(tensor, world_size):
        return default_hooks.allreduce_hook(process_group, bucket)
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    work = dist.all_gather(gathered, tensor, group=group, async_op=True)

    def average(_future) -> torch.Tensor:
        return torch.stack(gathered).sum(dim=0).div_(world_size)

    return work.get_future().then(average)
