"""Allreduce, plain and grouped, blocking and async, in place or not (the sparse one is in ``gather``).

Semantics follow Horovod 0.28.1 on CPU/gloo: ``op`` is Average (default), Sum, Min, Max or Product; the tensor
is multiplied by ``prescale_factor`` before the reduction and by ``postscale_factor`` after it (Average is a Sum
whose postscale factor is divided by the set's size), in Horovod's arithmetic (see ``engine.scale_``).
``name`` is accepted and unused: ops on one process set pair up across ranks by call order, so every rank must
issue them in the same order. The ranks first agree on the request (``negotiation``: op, types, shapes, scale
factors), except for DistributedOptimizer's gradients. Autograd flows through ``allreduce`` and
``grouped_allreduce`` as in Horovod: the gradient is allreduced with the same op and factors.

Errors, for every function here: ``ValueError`` for an unsupported type (Horovod's: float16/32/64, int32/64), a
non-contiguous tensor, an unregistered process set or one this rank is not in, both ``op`` and ``average``;
``NotImplementedError`` for ``op=Adasum`` and non-CPU tensors; ``HorovodInternalError`` when the collective
fails or the ranks' requests disagree (from ``synchronize``, with Horovod's message).
"""
from __future__ import annotations

import torch

from . import engine, negotiation
from .compression import Compression
from .engine import Average, resolve_op, synchronize
from .process_sets import global_process_set, members


def launch(tensor, output, op, prescale_factor, postscale_factor, process_set, call, gradients=False) -> int:
    """Start reducing ``tensor`` into ``output`` (``tensor`` itself for in place); returns the handle.
    ``gradients`` sends it on the set's gradient group (DistributedOptimizer's own channel)."""
    return launch_many([tensor], [output], op, prescale_factor, postscale_factor, process_set, call, gradients,
                       grouped=False)


def launch_many(tensors, outputs, op, prescale_factor, postscale_factor, process_set, call, gradients=False,
                grouped=True) -> int:
    """``launch`` for a group of tensors under one handle; its result is the tuple of outputs."""
    import torch.distributed as dist

    for tensor in tensors:
        engine.check_tensor(tensor, call, reduce=True)
    reduction = engine.torch_op(op, call)
    set_ = members(process_set)
    group = set_.grad_group if gradients else set_.group
    if not gradients:  # DistributedOptimizer's are checked when it is built (see negotiation)
        error = negotiation.negotiate(set_, negotiation.request(negotiation.ALLREDUCE, tensors, op,
                                                                (prescale_factor, postscale_factor)))
        if error:
            return engine.failed(error)
    # Average divides by the set's size in the postscale factor, in double, as Horovod's gloo path does.
    post = postscale_factor / set_.size if op == Average else postscale_factor
    works, buffers = [], []
    for tensor, output in zip(tensors, outputs):
        buffer = output.detach()  # torch.distributed writes in place; a parameter's grad must not trip autograd
        if output is not tensor:
            buffer.copy_(tensor.detach())
        engine.scale_(buffer, prescale_factor)
        works.append(engine.run(lambda b=buffer: dist.all_reduce(b, op=reduction, group=group, async_op=True)))
        buffers.append(buffer)

    def finish():
        for buffer in buffers:
            engine.scale_(buffer, post)
        return tuple(outputs) if grouped else outputs[0]

    return engine.submit(works, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start reducing ``tensor`` across the set (the input is not modified); returns a handle for ``poll`` and
    ``synchronize``, which gives the reduced tensor."""
    return launch(tensor, tensor.new(tensor.shape), resolve_op(op, average), prescale_factor, postscale_factor,
                  process_set, "hvd.allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """Start reducing ``tensor`` in place; returns a handle (``synchronize`` gives ``tensor`` back)."""
    return launch(tensor, tensor, resolve_op(op, average), prescale_factor, postscale_factor, process_set,
                  "hvd.allreduce_async_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """Reduce ``tensor`` in place across the set and return it."""
    return synchronize(launch(tensor, tensor, resolve_op(op, average), prescale_factor, postscale_factor,
                              process_set, "hvd.allreduce_"))


class _Allreduce(torch.autograd.Function):
    """Horovod's HorovodAllreduce: the gradient of an allreduce is the allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return synchronize(launch(tensor, tensor.new(tensor.shape), resolve_op(op, average), prescale_factor,
                                  postscale_factor, process_set, "hvd.allreduce"))

    @staticmethod
    def backward(ctx, grad_output):
        average, op, prescale_factor, postscale_factor, process_set = ctx.args
        grad = allreduce(grad_output, average=average, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduce ``tensor`` across the set and return the result (a new tensor of the same shape and type),
    compressed on the way with ``compression``. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set) -> int:
    """Start reducing each of ``tensors`` (inputs unchanged); ``synchronize`` gives a tuple of results."""
    return launch_many(tensors, [t.new(t.shape) for t in tensors], resolve_op(op, average), prescale_factor,
                       postscale_factor, process_set, "hvd.grouped_allreduce_async")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> int:
    """Start reducing each of ``tensors`` in place; ``synchronize`` gives them back as a tuple."""
    return launch_many(tensors, list(tensors), resolve_op(op, average), prescale_factor, postscale_factor,
                       process_set, "hvd.grouped_allreduce_async_")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """Reduce each of ``tensors`` in place; returns them as a tuple."""
    return synchronize(launch_many(tensors, list(tensors), resolve_op(op, average), prescale_factor,
                                   postscale_factor, process_set, "hvd.grouped_allreduce_"))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return synchronize(launch_many(list(tensors), [t.new(t.shape) for t in tensors], resolve_op(op, average),
                                       prescale_factor, postscale_factor, process_set, "hvd.grouped_allreduce"))

    @staticmethod
    def backward(ctx, *grad_outputs):
        average, op, prescale_factor, postscale_factor, process_set = ctx.args
        grads = grouped_allreduce(list(grad_outputs), average=average, op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, process_set=process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduce each of ``tensors``; returns a list of results. Differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                      *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]
