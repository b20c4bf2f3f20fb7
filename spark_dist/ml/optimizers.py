"""The estimator's optimizers by name (``'adam'``, ``'adamw'``, ``'sgd'``) for a model on CPU, computed as torch.optim
computes them there, without torch.optim's classes.

Why: making any ``torch.optim`` optimizer imports ``torch._dynamo`` (its ``add_param_group`` is wrapped in
``torch._disable_dynamo``, its ``step`` in a graph break), which costs a fresh rank more than a small model's
whole training; a session's first fit runs in fresh ranks, so every rank would pay it (BENCHMARKS.md, Spark ML).

What: torch.optim's defaults for each name (``Adam``: betas 0.9, 0.999, eps 1e-8, no weight decay; ``AdamW``: the
same with decoupled weight decay 0.01; ``SGD``: no momentum), updated with the same tensor operations, in the same
order, as torch.optim's single-tensor path, which it takes for CPU tensors (its ``foreach`` and ``fused`` kernels
are for accelerators). ``tests/test_optimizers.py`` trains with each of these and with torch.optim's class side by
side on the installed torch and requires the same weights, bit for bit. A parameter without a gradient is left
as it is, as torch.optim leaves it.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List

import torch


class _OnCpu:
    """What the training loop uses of a torch.optim optimizer: ``param_groups[0]["lr"]``, ``zero_grad()`` (to
    ``None``, torch's default) and ``step()``."""

    def __init__(self, parameters: Iterable, lr: float):
        self.param_groups: List[Dict] = [{"params": list(parameters), "lr": float(lr)}]

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def step(self) -> None:
        group = self.param_groups[0]
        lr = float(group["lr"])  # the training loop sets it before each step
        with torch.no_grad():
            for i, p in enumerate(group["params"]):
                if p.grad is not None:
                    self._update(i, p, p.grad, lr)

    def _update(self, i: int, param, grad, lr: float) -> None:
        raise NotImplementedError


class SGD(_OnCpu):
    """``torch.optim.SGD(parameters, lr)``: momentum 0, dampening 0, no weight decay."""

    def _update(self, i, param, grad, lr):
        param.add_(grad, alpha=-lr)


class Adam(_OnCpu):
    """``torch.optim.Adam(parameters, lr)``; ``weight_decay`` with ``decoupled``: ``torch.optim.AdamW``."""

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, parameters: Iterable, lr: float, weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(parameters, lr)
        self.weight_decay, self.decoupled = weight_decay, decoupled
        self.steps: Dict[int, int] = {}
        self.moments: Dict[int, tuple] = {}  # (exp_avg, exp_avg_sq), made at a parameter's first step

    def _update(self, i, param, grad, lr):
        beta1, beta2 = self.betas
        if i not in self.moments:
            self.moments[i] = (torch.zeros_like(param, memory_format=torch.preserve_format),
                               torch.zeros_like(param, memory_format=torch.preserve_format))
        exp_avg, exp_avg_sq = self.moments[i]
        step = self.steps[i] = self.steps.get(i, 0) + 1
        if self.weight_decay != 0:
            if self.decoupled:
                param.mul_(1 - lr * self.weight_decay)
            else:
                grad = grad.add(param, alpha=self.weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # torch counts steps in a float32 tensor and reads them back as a float: exact for whole numbers < 2**24
        bias_correction1 = 1 - beta1 ** float(step)
        bias_correction2 = 1 - beta2 ** float(step)
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def _adamw(parameters, lr):
    return Adam(parameters, lr, weight_decay=1e-2, decoupled=True)


BY_NAME: Dict[str, Callable] = {"adam": Adam, "adamw": _adamw, "sgd": SGD}


def serves(parameters: List) -> bool:
    """Whether these optimizers update ``parameters`` as torch.optim would: real floating-point tensors on CPU
    (torch.optim views complex ones as real pairs, and picks other kernels on accelerators)."""
    return all(p.device.type == "cpu" and p.is_floating_point() for p in parameters)
