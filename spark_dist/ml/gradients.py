"""How the estimator's ranks average their gradients on CPU: small buckets by one all-gather, not all-reduce; and a
small model's replicas kept equal without DDP (:class:`GatheredReplicas`).

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
    return tensor.device.type == "cpu" and _small(tensor.numel() * tensor.element_size(), world_size)


def _small(bucket_bytes: int, world_size: int) -> bool:
    return bucket_bytes * world_size <= SMALL_BUCKET_BYTES


def _mean_in_rank_order(gathered, world_size: int) -> torch.Tensor:
    """The ranks' copies summed in rank order, then divided: the same numbers on every rank."""
    return torch.stack(gathered).sum(dim=0).div_(world_size)


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
        return _mean_in_rank_order(gathered, world_size)

    return work.get_future().then(average)


def one_small_bucket(parameters, world_size: int) -> bool:
    """Whether all of a model's gradients together make one small CPU bucket (:func:`gathers`): then DDP would
    average them in a single all-gather after the backward pass, which :class:`GatheredReplicas` does too."""
    parameters = [p for p in parameters if p.requires_grad]
    if not parameters or any(p.device.type != "cpu" or not p.is_floating_point() for p in parameters):
        return False
    bucket_bytes = sum(p.numel() * p.element_size() for p in parameters)
    return _small(bucket_bytes, world_size) and len({p.dtype for p in parameters}) == 1


class GatheredReplicas:
    """A small CPU model's replicas kept equal as DDP with :func:`average_small_buckets_by_all_gather` keeps them,
    without DDP: ``torch.nn.parallel.DistributedDataParallel`` imports ``torch._dynamo`` when it is made, 2.2-2.4 s
    of a core in every fresh rank on this project's machine (spark_dist.ml.optimizers says why that matters).

    For a model whose gradients make one small bucket (:func:`one_small_bucket`) DDP adds nothing to what this
    does: rank 0's parameters and buffers to every rank at the start, rank 0's buffers again before each forward
    pass (``broadcast_buffers=True``, DDP's default), and after the backward pass the gradients averaged in one
    all-gather, summed in rank order, so every rank gets the same numbers as the hook gives DDP's bucket. A
    parameter without a gradient on a rank counts as zeros there (where DDP without ``find_unused_parameters``
    would stop the run). Call :meth:`average_gradients` between ``backward()`` and the optimizer's step.
    """

    def __init__(self, module):
        self.module = module
        self.world_size = dist.get_world_size()
        self._parameters = [p for p in module.parameters() if p.requires_grad]
        self._buffers = list(module.buffers()) if self.world_size > 1 else []
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, 0)

    def __call__(self, *args, **kwargs):
        if self._buffers:
            with torch.no_grad():
                for tensor in self._buffers:
                    dist.broadcast(tensor, 0)
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> "GatheredReplicas":
        self.module.train(mode)
        return self

    def eval(self) -> "GatheredReplicas":
        return self.train(False)

    def average_gradients(self) -> None:
        """Every rank's gradients replaced by their average over the ranks (one all-gather)."""
        if self.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        gathered = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(gathered, flat)
        average = _mean_in_rank_order(gathered, self.world_size)
        offset = 0
        for p in self._parameters:
            n = p.numel()
            p.grad = average[offset:offset + n].view_as(p)
            offset += n
