"""``hvd.DistributedOptimizer``: wraps a torch optimizer so that ``step()`` applies gradients reduced across the
process set (averaged by default).

As in Horovod, a hook on each parameter's gradient accumulation counts backward passes and starts the
parameter's allreduce once ``backward_passes_per_step`` passes are in; ``synchronize()`` (called by ``step()``
unless inside ``skip_synchronize()``) starts whatever has not started, waits, and writes the reduced gradients.

Invariant: gradients are sent in one fixed order on every rank, the reverse of the parameters' order in
``param_groups`` (roughly the order backward produces them): a hook only starts its parameter once every
parameter before it in that order has started, and ``synchronize()`` starts the rest in that order. torch's
collectives pair up by call order, not by Horovod's names, so this is what makes a rank whose hooks fire in
another order (a parameter unused on one rank, gradients that arrive in another order) still pair each gradient
with the same parameter's elsewhere. They run on the process set's gradient group, apart from the script's own
collectives. Construction checks once that every rank of the set has the same parameter names and shapes in the
same order (the names Horovod would match by).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import warnings

import torch

from . import engine
from .gather import sparse_launch
from .reductions import launch
from .compression import Compression
from .engine import Adasum, Average, synchronize
from .process_sets import global_process_set, members

_STEPS_EXCEEDED = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                   "Increase backward_passes_per_step to accumulate gradients locally.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in before the wrapped optimizer's class: ``super()`` is that class."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False, process_set=global_process_set):
        super().__init__(params)
        from .basics import size

        self._compression = compression
        named_parameters = self._named(named_parameters)
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = _check_groups(groups)
        self._handles = {}  # parameter -> (handle or None while its passes are not all in, compression context)
        self._grad_accs = []  # the hooks' handles
        self._order = []  # the parameters to reduce, in sending order (see the module's invariant)
        self._ready = set()  # parameters whose passes are all in
        self._started = 0  # self._order[:_started] have started
        self._synchronized = False
        self._should_synchronize = True
        if self.process_set.included() and (size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._order = [p for group in reversed(self.param_groups) for p in reversed(group["params"])
                           if p.requires_grad]
            self._check_same_parameters()
            for p in self._order:
                self._grad_accs.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _named(self, named_parameters):
        """Horovod's checks: (name, tensor) pairs, unique names, every optimized parameter named."""
        if named_parameters is None:
            return [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                    for j, v in enumerate(group["params"])]
        named_parameters = list(named_parameters)
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                             "by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                             % ", ".join(dups))
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = {id(v) for group in self.param_groups for v in group["params"]} - named_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                             "Python object ids: %s" % ", ".join(str(i) for i in unnamed))
        return named_parameters

    def _check_same_parameters(self):
        """Every rank of the set must send the same gradients in the same order: compare digests of the names and
        shapes once (collective over the set), so that a mismatch fails here on every rank instead of pairing
        one parameter's gradient with another's."""
        import torch.distributed as dist

        described = repr([(self._parameter_names.get(p), tuple(p.shape)) for p in self._order]).encode()
        digest = torch.tensor([int.from_bytes(hashlib.sha256(described).digest()[:7], "big")], dtype=torch.int64)
        set_ = members(self.process_set)
        everyone = [torch.empty_like(digest) for _ in range(set_.size)]
        engine.run(lambda: dist.all_gather(everyone, digest, group=set_.grad_group))
        if any(not torch.equal(d, digest) for d in everyone):
            raise ValueError("DistributedOptimizer: the ranks of the process set do not have the same parameters "
                             "(names and shapes, in the same order); build the model and the optimizer alike on "
                             "every rank")

    def load_state_dict(self, *args, **kwargs):
        self._reset_passes()
        super().load_state_dict(*args, **kwargs)

    def _reset_passes(self):
        self._handles = {}
        self._ready.clear()
        self._started = 0
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def set_backward_passes_per_step(self, passes):
        """Change how many backward passes accumulate before gradients are reduced."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # No gradient here (the parameter was unused on this rank): the other ranks still send theirs.
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_launch(tensor, name, self.op, self.process_set, gradients=True), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average and self._groups is None:
            # Horovod splits the average around the sum; its grouped path (groups=...) does not.
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            prescale, postscale = 1.0, 1.0
        handle = launch(compressed, compressed, self.op, prescale, postscale, self.process_set,
                        "hvd.DistributedOptimizer", gradients=True)
        return handle, ctx

    def _start_ready(self):
        while self._started < len(self._order) and self._order[self._started] in self._ready:
            p = self._order[self._started]
            self._started += 1
            self._handles[p] = self._allreduce_grad_async(p)

    def _make_hook(self, p):
        def hook(*ignore):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_STEPS_EXCEEDED)
            assert not p.grad.requires_grad
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._ready.add(p)
                self._handles.setdefault(p, (None, None))
                self._start_ready()
            else:
                self._handles[p] = (None, None)
        return hook

    def synchronize(self):
        """Start every gradient reduction not started yet (in the fixed order), wait for all, and write the
        reduced gradients into ``p.grad``. Collective over the process set.

        Raises:
            HorovodInternalError: a reduction failed.
        """
        if not self.process_set.included():
            self._synchronized = True
            return
        while self._started < len(self._order):
            p = self._order[self._started]
            self._started += 1
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            output = handle() if callable(handle) else synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if p.grad.is_sparse:
                reduced = self._compression.decompress(output, ctx)
                # sparse grads take no set_(); zero and add is the same
                p.grad.zero_().add_(reduced if reduced.is_sparse else reduced.to_sparse())
            else:
                p.grad.set_(self._compression.decompress(output, ctx))
        self._handles.clear()
        self._ready.clear()
        self._started = 0
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside it, ``step()`` does not synchronize: for ``synchronize()``, then gradient clipping, then
        ``step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True):
        """Raises AssertionError between ``backward()`` and ``step()``/``synchronize()``, as Horovod's does: the
        gradients may still be in flight."""
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super().zero_grad(set_to_none)


def _check_groups(groups):
    if groups is None:
        return None
    if not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    return groups


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """An optimizer of ``optimizer``'s class over its ``param_groups`` whose ``step()`` first reduces the
    gradients across ``process_set`` with ``op``. Horovod's arguments: ``named_parameters`` (names for the
    gradients; all parameters must be named), ``compression``, ``backward_passes_per_step`` (backward passes that
    accumulate locally before each reduction), ``gradient_predivide_factor`` (Average only: gradients are divided
    by it before the sum and multiplied by it over the size after), ``groups``/``num_groups`` (accepted; fusing
    changes nothing here), ``sparse_as_dense`` (reduce sparse gradients densely). Collective over the set.

    Raises:
        NotImplementedError: ``op=hvd.Adasum``.
        ValueError: ``gradient_predivide_factor`` with an op other than Average, ``backward_passes_per_step``
            below 1, bad ``named_parameters`` or ``groups``, or ranks whose parameters differ.
    """
    if op == Adasum:
        raise engine.unsupported("hvd.DistributedOptimizer(op=hvd.Adasum)", "Adasum is a reduction of Horovod's "
                                 "own C++ core")
    engine.torch_op(op, "hvd.DistributedOptimizer")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
