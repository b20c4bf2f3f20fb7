"""``hvd.SyncBatchNorm``: batch normalization whose batch statistics span every rank's batch.

Horovod's needs CUDA tensors (it calls CUDA-only torch kernels), as does ``torch.nn.SyncBatchNorm``; this one
computes the same thing on the CPU: the forward pass allreduces each channel's count, sum and sum of squares (in
float64, so the variance keeps its precision), the backward pass the sums of the output gradient and of its
product with the normalized input. The result equals ``BatchNorm`` over the concatenation of all ranks' batches
(ranks may hold batches of different sizes). The weight and bias gradients stay local, as in Horovod:
DistributedOptimizer reduces them. Collectives run over the global process set, in the order the layers run,
which is the same on every rank.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .engine import Sum


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """(N, C, *) as (C, N * prod(*)): one row per channel."""
    return tensor.transpose(0, 1).reshape(tensor.shape[1], -1)


def _per_channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (C,) tensor shaped to broadcast against ``like`` (N, C, *)."""
    return values.view(1, -1, *([1] * (like.dim() - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        from .reductions import allreduce

        rows = _channels_last(input.detach()).double()
        channels = rows.shape[0]
        count = torch.tensor([float(rows.shape[1])], dtype=torch.float64)
        local = torch.cat([rows.sum(1), (rows * rows).sum(1), count])
        total = allreduce(local, op=Sum, name="sync_batch_norm.stats")
        count = total[-1]
        mean = total[:channels] / count
        var = (total[channels:2 * channels] / count - mean * mean).clamp_min(0)  # biased, as normalization uses
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * count / (count - 1) if count > 1 else var
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        invstd = torch.rsqrt(var + eps)
        normalized = (input - _per_channel(mean, input).to(input.dtype)) * _per_channel(invstd, input).to(input.dtype)
        ctx.save_for_backward(normalized, weight, invstd, count)
        output = normalized
        if weight is not None:
            output = output * _per_channel(weight, input)
        if bias is not None:
            output = output + _per_channel(bias, input)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        from .reductions import allreduce

        normalized, weight, invstd, count = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        rows = _channels_last(grad_output).double()
        local_sum_dy = rows.sum(1)
        local_sum_dy_xhat = (rows * _channels_last(normalized).double()).sum(1)
        grad_input = grad_weight = grad_bias = None
        if need_input:
            sums = allreduce(torch.cat([local_sum_dy, local_sum_dy_xhat]), op=Sum, name="sync_batch_norm.grads")
            channels = local_sum_dy.shape[0]
            mean_dy = _per_channel(sums[:channels] / count, grad_output)
            mean_dy_xhat = _per_channel(sums[channels:] / count, grad_output)
            scale = _per_channel(invstd, grad_output)
            if weight is not None:
                scale = scale * _per_channel(weight.detach().double(), grad_output)
            grad_input = (scale * (grad_output.double() - mean_dy - normalized.double() * mean_dy_xhat)).to(
                grad_output.dtype)
        if weight is not None and need_weight:
            grad_weight = local_sum_dy_xhat.to(weight.dtype)
        if weight is not None and need_bias:
            grad_bias = local_sum_dy.to(weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over all ranks' batches (N, C, *) in training; the running statistics otherwise, as
    ``BatchNorm``. Horovod's signature: ``num_features``, ``eps``, ``momentum`` (``None``: a cumulative average),
    ``affine``, ``track_running_stats``.

    Raises:
        ValueError: an input of fewer than 2 dimensions.
        HorovodInternalError: a collective failed.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        from .basics import size

        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        if size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, factor,
                                self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                            self.eps, factor)
