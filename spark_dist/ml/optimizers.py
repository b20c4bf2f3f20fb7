"""The estimator's optimizers by name (``'adam'``, ``'adamw'``, ``'sgd'``) for a model on CPU: torch's functional
optimizers (``torch.optim.adam.adam``, ``torch.optim.adamw.adamw``, ``torch.optim.sgd.sgd``) with the state
torch.optim's classes would keep, without those classes.

Why not the classes: making any ``torch.optim`` optimizer imports ``torch._dynamo`` (its ``add_param_group`` is
wrapped in ``torch._disable_dynamo``, its ``step`` in a graph break), a cost a fresh rank pays before its first
step, and a session's first fit runs in fresh ranks (docs/speedups.md). The functional forms are the arithmetic the
classes call, and import nothing more.

Invariant: each name updates its parameters exactly as ``torch.optim.<Class>(parameters, lr=lr)`` does on CPU,
bit for bit (tests/unit/test_optimizers.py): the classes' defaults (``Adam``: betas 0.9, 0.999, eps 1e-8, no weight
decay; ``AdamW``: the same with decoupled weight decay 0.01; ``SGD``: no momentum), their step counters (scalar
tensors, as ``torch.optim`` keeps them), and their single-tensor kernels (``foreach=False``: what the classes choose
for CPU tensors). A parameter without a gradient is left as it is, its step count too, as torch.optim leaves it.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List

import torch
from torch.optim.adam import adam
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd


# torch.optim's step counters: float32 tensors, float64 where that is torch's default dtype.
_STEP_DTYPE = {False: torch.float32, True: torch.float64}


class _Functional:
    """What the training loop uses of a torch.optim optimizer: ``param_groups[0]["lr"]``, ``zero_grad()`` (to
    ``None``, torch's default), ``step()``, and ``state_dict()`` / ``load_state_dict()`` for checkpoints."""

    def __init__(self, parameters: Iterable, lr: float):
        self.param_groups: List[Dict] = [{"params": list(parameters), "lr": float(lr)}]
        self.state: Dict[torch.Tensor, tuple] = {}  # per parameter, what its kernel keeps between steps

    def state_dict(self) -> Dict:
        """What a checkpoint keeps to go on exactly: the learning rate and each parameter's state, by the
        parameter's place (a copy)."""
        params = self.param_groups[0]["params"]
        return {"lr": self.param_groups[0]["lr"],
                "state": {i: tuple(t.clone() for t in self.state[p]) for i, p in enumerate(params) if p in self.state}}

    def load_state_dict(self, saved: Dict) -> None:
        """Go on from :meth:`state_dict` of an optimizer of the same parameters."""
        params = self.param_groups[0]["params"]
        self.param_groups[0]["lr"] = saved["lr"]
        self.state = {params[i]: tuple(t.clone() for t in kept) for i, kept in saved["state"].items()}

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def step(self) -> None:
        group = self.param_groups[0]
        with_grad = [p for p in group["params"] if p.grad is not None]
        if with_grad:
            with torch.no_grad():
                self._update(with_grad, [p.grad for p in with_grad], float(group["lr"]))

    def _update(self, params: List, grads: List, lr: float) -> None:
        raise NotImplementedError


class SGD(_Functional):
    """``torch.optim.SGD(parameters, lr)``: momentum 0, dampening 0, no weight decay."""

    def _update(self, params, grads, lr):
        sgd(params, grads, [None] * len(params), foreach=False, weight_decay=0.0, momentum=0.0, lr=lr,
            dampening=0.0, nesterov=False, maximize=False)


class Adam(_Functional):
    """``torch.optim.Adam(parameters, lr)``; :func:`_adamw`: ``torch.optim.AdamW(parameters, lr)``."""

    def __init__(self, parameters: Iterable, lr: float, weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(parameters, lr)
        self.weight_decay = weight_decay
        self._kernel = adamw if decoupled else adam  # its state: (exp_avg, exp_avg_sq, step), from a first step

    def _state_of(self, param) -> tuple:
        if param not in self.state:
            self.state[param] = (torch.zeros_like(param, memory_format=torch.preserve_format),
                                 torch.zeros_like(param, memory_format=torch.preserve_format),
                                 torch.tensor(0.0, dtype=_STEP_DTYPE[torch.get_default_dtype() == torch.float64]))
        return self.state[param]

    def _update(self, params, grads, lr):
        exp_avgs, exp_avg_sqs, steps = zip(*(self._state_of(p) for p in params))
        self._kernel(params, grads, list(exp_avgs), list(exp_avg_sqs), [], list(steps), foreach=False,
                     capturable=False, differentiable=False, fused=None, grad_scale=None, found_inf=None,
                     has_complex=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=lr,
                     weight_decay=self.weight_decay, eps=1e-8, maximize=False)


def _adamw(parameters, lr):
    return Adam(parameters, lr, weight_decay=1e-2, decoupled=True)


BY_NAME: Dict[str, Callable] = {"adam": Adam, "adamw": _adamw, "sgd": SGD}


def serves(parameters: List) -> bool:
    """Whether these optimizers update ``parameters`` as torch.optim would: real floating-point tensors on CPU
    (torch.optim views complex ones as real pairs, and picks other kernels on accelerators)."""
    return all(p.device.type == "cpu" and p.is_floating_point() for p in parameters)
