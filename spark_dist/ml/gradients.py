"""A small CPU model's replicas kept equal as DDP keeps them, without DDP (:class:`Replicas`).

``torch.nn.parallel.DistributedDataParallel`` imports ``torch._dynamo`` when it is made, a cost every fresh rank
pays before its first step (docs/speedups.md). For a model whose gradients all fit DDP's first bucket, DDP adds
nothing to what :class:`Replicas` does: it waits for the whole backward pass, then averages that one bucket by
one all-reduce. Larger models keep DDP, which overlaps its buckets' all-reduces with the backward pass.
"""
import torch
import torch.distributed as dist

# DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES): gradients within it make one all-reduce.
ONE_BUCKET_BYTES = 1 << 20


def one_bucket(parameters) -> bool:
    """Whether all of a model's trainable gradients make one DDP bucket on CPU: real floating-point tensors of
    one dtype (one flat tensor holds one dtype), :data:`ONE_BUCKET_BYTES` at most together."""
    parameters = [p for p in parameters if p.requires_grad]
    if not parameters or any(p.device.type != "cpu" or not p.is_floating_point() for p in parameters):
        return False
    bucket_bytes = sum(p.numel() * p.element_size() for p in parameters)
    return bucket_bytes <= ONE_BUCKET_BYTES and len({p.dtype for p in parameters}) == 1


class Replicas:
    """A small CPU model's replicas (:func:`one_bucket`) kept equal as DDP with its defaults keeps them:
    rank 0's parameters and buffers to every rank at the start, rank 0's buffers again before each forward pass
    (``broadcast_buffers=True``), and after the backward pass every gradient multiplied by ``1 / world_size``,
    then summed over the ranks by one all-reduce, as DDP's reducer does for a bucket without a comm hook. A
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

    def train(self, mode: bool = True) -> "Replicas":
        self.module.train(mode)
        return self

    def eval(self) -> "Replicas":
        return self.train(False)

    def average_gradients(self) -> None:
        """Every rank's gradients replaced by their average over the ranks (one all-reduce)."""
        if self.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._parameters]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(1.0 / self.world_size)
        dist.all_reduce(flat)
        offset = 0
        for p in self._parameters:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p)
            offset += n
