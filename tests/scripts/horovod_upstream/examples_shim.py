"""Runs one of Horovod's PyTorch examples unchanged in a rank (rank_main.py's ``example`` mode) and records what
it computed, so that two implementations of ``horovod.torch`` can be compared step by step.

Around the script, without editing it:

* Data: where torchvision is absent (this project's environments), ``stand_ins/`` goes first on ``sys.path``:
  its ``torchvision`` gives generated MNIST images and a small ``models.tiny_convnet`` (see
  ``stand_ins/torchvision``). Where torchvision is installed, its ``datasets.MNIST`` is replaced by the stand-in's
  generated one (nothing can be downloaded) and ``models.tiny_convnet`` is added.
* Seed: ``torch``, ``random`` and numpy are seeded with the same seed in every rank and run, and torch uses one
  thread (2 ranks share the machine's cores).
* Record: ``torch.nn.functional.nll_loss`` and ``cross_entropy`` (what the examples call, looked up on the
  module at each call) are wrapped to keep every loss they return, in order; ``hvd.DistributedOptimizer`` is
  wrapped to keep the optimizer it returns and count its ``step()`` calls. After the script, ``OUT`` gets
  ``{"losses": [...], "steps": n, "weights": [each parameter of the optimizer, by group and order]}``.
"""
import functools
import importlib.util
import os
import random
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STAND_INS = os.path.join(HERE, "stand_ins")


def _data():
    if importlib.util.find_spec("torchvision") is None:
        sys.path.insert(0, STAND_INS)
        return
    import torchvision

    def stand_in(name):
        spec = importlib.util.spec_from_file_location(f"stand_in_{name}",
                                                      os.path.join(STAND_INS, "torchvision", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    torchvision.datasets.MNIST = stand_in("datasets").MNIST
    torchvision.models.tiny_convnet = stand_in("models").tiny_convnet


def _record_losses(record):
    import torch.nn.functional as F

    def recorded(loss_fn):
        @functools.wraps(loss_fn)
        def loss(*args, **kwargs):
            value = loss_fn(*args, **kwargs)
            record["losses"].append(value.detach().clone())
            return value
        return loss

    F.nll_loss = recorded(F.nll_loss)
    F.cross_entropy = recorded(F.cross_entropy)


def _record_optimizer(record):
    import horovod.torch as hvd

    make = hvd.DistributedOptimizer

    @functools.wraps(make)
    def distributed_optimizer(*args, **kwargs):
        optimizer = make(*args, **kwargs)
        record["optimizers"].append(optimizer)
        step = optimizer.step

        @functools.wraps(step)
        def counted_step(*step_args, **step_kwargs):
            record["steps"] += 1
            return step(*step_args, **step_kwargs)

        optimizer.step = counted_step
        return optimizer

    hvd.DistributedOptimizer = distributed_optimizer


def run(script, script_args, seed, out):
    """``script`` as ``__main__`` with ``script_args``; then what it computed to ``out`` (see the module)."""
    import numpy as np
    import torch

    _data()
    record = {"losses": [], "steps": 0, "optimizers": []}
    _record_losses(record)
    _record_optimizer(record)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")
    weights = [p.detach().clone() for optimizer in record.pop("optimizers")
               for group in optimizer.param_groups for p in group["params"]]
    torch.save(dict(record, weights=weights), out)
