"""Allgather (first dimensions may differ across ranks, as Horovod allows) and broadcast, blocking and async;
and Horovod's sparse allreduce, which is two allgathers.

``root_rank`` is a *global* rank, also with a process set (Horovod's rule). ``name`` is accepted and unused:
ops on one process set pair up by call order. Both first agree on the request (``negotiation``: types, the
dimensions after the first for allgather, the shape and root rank for broadcast), then allgather exchanges every
rank's first dimension (blocking, also for ``allgather_async``).

Errors, for every function here: ``ValueError`` for an unsupported type (Horovod's: uint8, int8, int16, int32,
int64, float16/32/64), a non-contiguous tensor, a root rank outside the set, an unregistered process set or one
this rank is not in; ``NotImplementedError`` for non-CPU tensors; ``HorovodInternalError`` when the collective
fails or the ranks' requests disagree (from ``synchronize``, with Horovod's message).
"""
from __future__ import annotations

from typing import List

import torch

from ..exceptions import HorovodInternalError
from . import engine, negotiation
from .engine import Average, synchronize
from .process_sets import global_process_set, members, my_rank
from .reductions import allreduce, grouped_allreduce

_MAX_DIMS = 32  # the shape exchange's fixed width; torch tensors rarely have more


def _shapes(tensors, set_, group, call) -> List[List[int]]:
    """Every member's first dimension of each of ``tensors`` (one row per tensor), after checking that
    members agree on each tensor's type and other dimensions. One blocking all_gather."""
    import torch.distributed as dist

    width = 2 + _MAX_DIMS
    mine = torch.full((len(tensors), width), -1, dtype=torch.int64)
    for i, tensor in enumerate(tensors):
        if tensor.dim() == 0 or tensor.dim() > _MAX_DIMS:
            raise ValueError(f"{call} takes tensors of 1 to {_MAX_DIMS} dimensions, got shape {list(tensor.shape)}")
        mine[i, 0] = engine.MOVE_DTYPES.index(tensor.dtype)
        mine[i, 1] = tensor.dim()
        mine[i, 2:2 + tensor.dim()] = torch.tensor(tensor.shape)
    everyone = [torch.empty_like(mine) for _ in range(set_.size)]
    engine.run(lambda: dist.all_gather(everyone, mine, group=group))
    for theirs, rank in zip(everyone, set_.ranks):
        # column 2 is the first dimension, which may differ; type, rank and the rest may not
        if not (torch.equal(theirs[:, :2], mine[:, :2]) and torch.equal(theirs[:, 3:], mine[:, 3:])):
            raise HorovodInternalError(f"Mismatched {call} tensor shapes or types: rank {rank} sent "
                                       f"{_describe(theirs)}, this rank {_describe(mine)}")
    return [[int(theirs[i, 2]) for theirs in everyone] for i in range(len(tensors))]


def _describe(rows) -> str:
    return ", ".join(f"{engine.MOVE_DTYPES[int(r[0])]}{list(map(int, r[2:2 + int(r[1])]))}" for r in rows)


def launch_allgather(tensors, process_set, call, grouped, gradients=False) -> int:
    """Start gathering ``tensors``; ``gradients`` runs on the set's gradient group (DistributedOptimizer's)."""
    import torch.distributed as dist

    for tensor in tensors:
        engine.check_tensor(tensor, call, reduce=False)
    set_ = members(process_set)
    group = set_.grad_group if gradients else set_.group
    if not gradients:
        error = negotiation.negotiate(set_, negotiation.request(negotiation.ALLGATHER, tensors))
        if error:
            return engine.failed(error)
    firsts = _shapes(tensors, set_, group, call)
    works, received = [], []
    for tensor, dims in zip(tensors, firsts):
        # gloo gathers equal sizes only: pad every rank's rows to the longest, trim after
        rows = max(dims)
        padded = tensor.detach()
        if padded.shape[0] < rows:
            padded = torch.cat([padded, padded.new_zeros((rows - padded.shape[0], *padded.shape[1:]))])
        parts = [padded.new_empty(padded.shape) for _ in dims]
        works.append(engine.run(lambda p=[engine.wire(x) for x in parts], t=engine.wire(padded):
                                dist.all_gather(p, t, group=group, async_op=True)))
        received.append((parts, dims))

    def finish():
        outputs = tuple(torch.cat([part[:n] for part, n in zip(parts, dims)]) for parts, dims in received)
        return outputs if grouped else outputs[0]

    return engine.submit(works, finish)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating ``tensor`` from every rank of the set along dimension 0, in rank order; returns a
    handle (``synchronize`` gives the result)."""
    return launch_allgather([tensor], process_set, "hvd.allgather_async", grouped=False)


class _Allgather(torch.autograd.Function):
    """Horovod's HorovodAllgather: the gradient is this rank's slice of the averaged gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(launch_allgather([tensor], process_set, "hvd.allgather", grouped=False))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32), process_set=ctx.process_set)
        offset = int(dims[:ctx.process_set.rank()].sum())
        return grad.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate ``tensor`` from every rank of the set along dimension 0, in rank order (first dimensions may
    differ; the others and the type must match). Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """``allgather_async`` of each of ``tensors`` under one handle; ``synchronize`` gives a tuple."""
    return launch_allgather(list(tensors), process_set, "hvd.grouped_allgather_async", grouped=True)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return synchronize(launch_allgather(list(tensors), process_set, "hvd.grouped_allgather", grouped=True))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=Average, process_set=ctx.process_set)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int32) for d in ctx.dims],
                                 process_set=ctx.process_set)
        rank = ctx.process_set.rank()
        return (None, None, *[g.narrow(0, int(d[:rank].sum()), n) for g, d, n in zip(grads, dims, ctx.dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """``allgather`` of each of ``tensors``; returns a tuple (Horovod's does). Differentiable."""
    return _GroupedAllgather.apply(name, process_set, *tensors)


def _launch_broadcast(tensor, output, root_rank, process_set, call) -> int:
    import torch.distributed as dist

    engine.check_tensor(tensor, call, reduce=False)
    set_ = members(process_set)
    if root_rank not in set_.ranks:
        raise ValueError(f"{call}: root_rank {root_rank} is not a rank of the process set {list(set_.ranks)} "
                         "(root_rank is a global rank)")
    error = negotiation.negotiate(set_, negotiation.request(negotiation.BROADCAST, [tensor], root=root_rank))
    if error:
        return engine.failed(error)
    buffer = output.detach()
    if output is not tensor:
        buffer.copy_(tensor.detach())
    work = engine.run(lambda: dist.broadcast(engine.wire(buffer), src=root_rank, group=set_.group, async_op=True))
    return engine.submit([work], lambda: output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start sending ``root_rank``'s ``tensor`` to every rank of the set (the input is not modified); returns a
    handle (``synchronize`` gives the received tensor)."""
    return _launch_broadcast(tensor, tensor.new(tensor.shape), root_rank, process_set, "hvd.broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start broadcasting into ``tensor`` in place; returns a handle."""
    return _launch_broadcast(tensor, tensor, root_rank, process_set, "hvd.broadcast_async_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``tensor`` with ``root_rank``'s and return it."""
    return synchronize(_launch_broadcast(tensor, tensor, root_rank, process_set, "hvd.broadcast_"))


class _Broadcast(torch.autograd.Function):
    """Horovod's HorovodBroadcast: the root gets the averaged gradient, the other ranks zeros."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(_launch_broadcast(tensor, tensor.new(tensor.shape), root_rank, process_set,
                                             "hvd.broadcast"))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if my_rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return ``root_rank``'s ``tensor`` on every rank of the set (a new tensor). Differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's reduction of a sparse COO gradient: allgather its indices and values (duplicates add up when the
    tensor is used), divided by the set's size for Average. Returns a callable that waits and gives the sparse
    result (DistributedOptimizer calls it in ``synchronize``)."""
    return sparse_launch(tensor, name, op, process_set)


def sparse_launch(tensor, name, op, process_set, gradients=False):
    """``sparse_allreduce_async``; ``gradients`` runs it on the set's gradient group."""
    set_size = members(process_set).size
    indices = launch_allgather([tensor._indices().transpose(0, 1).contiguous()], process_set,
                               "hvd.sparse_allreduce_async", grouped=False, gradients=gradients)
    values = launch_allgather([tensor._values()], process_set, "hvd.sparse_allreduce_async", grouped=False,
                              gradients=gradients)

    def handle():
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == Average:
            gathered_values = gathered_values / set_size
        if gathered_indices.dim() == 0 or gathered_values.dim() == 0:
            return tensor.new().resize_as_(tensor)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, tensor.size())

    return handle
