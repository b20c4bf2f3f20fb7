"""Alltoall (with or without splits) and reducescatter (plain and grouped), blocking and async.

Alltoall slices dimension 0: ``splits[i]`` rows go to the set's i-th rank (equal slices without ``splits``);
every rank first learns how many rows it receives (a blocking exchange, also for ``alltoall_async``).
Reducescatter reduces over the set (Sum or Average, with pre/postscale as allreduce) and gives each rank its
slice of dimension 0: Horovod's split, where the first ``rows % size`` ranks get one row more. It runs as an
allreduce on gloo, which has no reduce-scatter here: the same result, more traffic.

Errors, for every function here: ``ValueError`` for an unsupported type (see allreduce and allgather), a
non-contiguous tensor, splits that do not fit the tensor, a reducescatter op other than Sum or Average, a
0-dimensional tensor, an unregistered process set or one this rank is not in; ``NotImplementedError`` for
non-CPU tensors and Adasum; ``HorovodInternalError`` when the collective fails or the ranks' requests disagree
(see ``negotiation``; from ``synchronize``, with Horovod's message).
"""
from __future__ import annotations

import torch

from . import engine, negotiation
from .compression import Compression
from .engine import Average, Sum, synchronize
from .process_sets import global_process_set, members


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start the exchange; returns a handle whose ``synchronize`` gives ``(output, received_splits)``
    (received splits: int32, or the type of a ``splits`` tensor)."""
    import torch.distributed as dist

    call = "hvd.alltoall"
    engine.check_tensor(tensor, call, reduce=False)
    set_ = members(process_set)
    rows = tensor.shape[0] if tensor.dim() else 0
    if splits is None:
        if tensor.dim() == 0 or rows % set_.size:
            raise ValueError(f"{call}: without splits, dimension 0 ({rows}) must divide evenly among the "
                             f"{set_.size} ranks of the set")
        send = [rows // set_.size] * set_.size
    else:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(send) != set_.size or min(send) < 0 or sum(send) != rows:
            raise ValueError(f"{call}: splits {send} must hold {set_.size} non-negative counts summing to "
                             f"dimension 0 of the tensor ({rows})")
    error = negotiation.negotiate(set_, negotiation.request(negotiation.ALLTOALL, [tensor]))
    if error:
        return engine.failed(error)
    counts = torch.empty(set_.size, dtype=torch.int64)
    engine.run(lambda: dist.all_to_all_single(counts, torch.tensor(send, dtype=torch.int64), group=set_.group))
    receive = counts.tolist()
    output = tensor.new_empty((sum(receive), *tensor.shape[1:]))
    work = engine.run(lambda: dist.all_to_all_single(engine.wire(output), engine.wire(tensor.detach()),
                                                     output_split_sizes=receive, input_split_sizes=send,
                                                     group=set_.group, async_op=True))
    received_type = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    return engine.submit([work], lambda: (output, counts.to(received_type)))


class _Alltoall(torch.autograd.Function):
    """Horovod's HorovodAlltoall: the gradient goes back the way the rows came."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set = process_set
        ctx.received_splits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received_splits, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send ``splits[i]`` rows of ``tensor`` to the set's i-th rank and gather what each sends here, in rank
    order. Returns the output alone without ``splits``, else ``(output, received_splits)``. Differentiable."""
    return _Alltoall.apply(tensor, splits, name, process_set)


def _launch_reducescatter(tensors, op, process_set, prescale_factor, postscale_factor, call, grouped) -> int:
    import torch.distributed as dist

    for tensor in tensors:
        engine.check_tensor(tensor, call, reduce=True)
        if tensor.dim() == 0:
            raise ValueError(f"{call} takes tensors of at least one dimension")
    reduction = engine.torch_op(op, call)
    if op not in (Sum, Average):
        raise ValueError(f"{call} supports op=hvd.Sum and hvd.Average only")
    set_ = members(process_set)
    error = negotiation.negotiate(set_, negotiation.request(negotiation.REDUCESCATTER, tensors, op,
                                                            (prescale_factor, postscale_factor)))
    if error:
        return engine.failed(error)
    post = postscale_factor / set_.size if op == Average else postscale_factor
    works, slices = [], []
    for tensor in tensors:
        buffer = engine.scale_(tensor.detach().clone(), prescale_factor)
        works.append(engine.run(lambda b=buffer: dist.all_reduce(b, op=reduction, group=set_.group, async_op=True)))
        rows = tensor.shape[0]
        counts = [rows // set_.size + (i < rows % set_.size) for i in range(set_.size)]
        slices.append((buffer, sum(counts[:set_.rank]), counts[set_.rank]))

    def finish():
        outputs = tuple(engine.scale_(b.narrow(0, start, n).clone(), post) for b, start, n in slices)
        return outputs if grouped else outputs[0]

    return engine.submit(works, finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start a reducescatter (input unchanged); returns a handle (``synchronize`` gives this rank's slice)."""
    return _launch_reducescatter([tensor], op, process_set, prescale_factor, postscale_factor,
                                 "hvd.reducescatter", grouped=False)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """``reducescatter_async`` of each of ``tensors`` under one handle; ``synchronize`` gives a tuple."""
    return _launch_reducescatter(list(tensors), op, process_set, prescale_factor, postscale_factor,
                                 "hvd.grouped_reducescatter", grouped=True)


def _scaled_back(grads, ctx):
    """Horovod's reducescatter backward: gradients scaled as the forward scaled, then gathered."""
    scaled = []
    for grad in grads:  # one factor at a time, in Horovod's order, for the same rounding
        for factor in (ctx.process_set.size() if ctx.op == Sum else 1, ctx.prescale_factor, ctx.postscale_factor):
            grad = grad * factor if factor != 1 else grad
        scaled.append(grad)
    return scaled


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        from .gather import allgather

        return allgather(_scaled_back([grad_output], ctx)[0], process_set=ctx.process_set), None, None, None, None, \
            None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the set and return this rank's slice of dimension 0. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                       postscale_factor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        from .gather import grouped_allgather

        return (None, None, None, None, None,
                *grouped_allgather(_scaled_back(grad_outputs, ctx), process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """``reducescatter`` of each of ``tensors``; returns a list. Differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]
