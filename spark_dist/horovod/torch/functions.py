"""Broadcasting a model's parameters and an optimizer's state, and moving picklable objects between ranks.

Objects travel as cloudpickle bytes (lambdas and local classes too, as in Horovod): a size, then the bytes, over
broadcast or allgather. ``broadcast_optimizer_state`` follows Horovod's algorithm: tensors of the state are
broadcast in place, scalars and options (learning rate, betas) travel together as one object.
"""
from __future__ import annotations

import collections
import io

import torch

from .gather import allgather, broadcast_, broadcast_async_
from .engine import synchronize
from .process_sets import global_process_set

try:
    import cloudpickle
except ImportError:  # pyspark, a spark_dist requirement, ships its own copy
    from pyspark import cloudpickle


def broadcast_parameters(params, root_rank):
    """Overwrite ``params`` in place with ``root_rank``'s: a ``state_dict()`` or other dict (broadcast in sorted
    key order), or a list of tensors or of ``(name, tensor)`` pairs (``named_parameters()``), in the same order
    on every rank.

    Raises:
        ValueError: ``params`` is neither a dict nor a list, or holds a tensor type broadcast refuses (bool).
        HorovodInternalError: a broadcast failed.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = [broadcast_async_(p, root_rank, name) for name, p in params]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Make ``optimizer``'s state and options (``param_groups`` values such as ``lr``) those of ``root_rank``.
    An optimizer that has not stepped yet first takes one step with zero gradients (without reducing them) so that
    its state exists, as in Horovod. ``model`` names sparse embeddings, whose zero gradients are then sparse.

    Raises:
        ValueError: ``torch.optim.LBFGS``, whose state cannot be broadcast piecewise.
        HorovodInternalError: a broadcast failed.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _initialize_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer: nothing to send
    tensors, scalars, setters = [], {}, {}
    occurrences = collections.defaultdict(int)
    for index, group in enumerate(state_dict["param_groups"]):
        for option, value in group.items():
            if option != "params":
                key = f"{option}.{index}"
                scalars[key] = value
                setters[key] = _option_setter(optimizer, index, option)
        for pid in group["params"]:
            for name, value in state_dict["state"].get(pid, {}).items():
                # the same state name recurs per parameter: keys count its occurrences, in the same order everywhere
                occurrences[name] += 1
                key = f"{name}.{occurrences[name]}"
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars[key] = value
                    setters[key] = _state_setter(state_dict, pid, name)
    broadcast_parameters(tensors, root_rank)
    for key, value in broadcast_object(scalars, root_rank).items():
        setters[key](value)


def _initialize_state(optimizer, model) -> None:
    from .optimizer import _DistributedOptimizer

    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    # A DistributedOptimizer's step() would reduce gradients, which other ranks (with state) would not match:
    # step the wrapped optimizer's class directly (the one after _DistributedOptimizer in the class's MRO).
    if isinstance(optimizer, _DistributedOptimizer):
        super(_DistributedOptimizer, optimizer).step()
    else:
        optimizer.step()


def _option_setter(optimizer, index, option):
    def set_option(value):
        optimizer.param_groups[index][option] = value
    return set_option


def _state_setter(state_dict, pid, name):
    def set_state(value):
        state_dict["state"][pid][name] = value  # the optimizer's own per-parameter dict
    return set_state


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return ``root_rank``'s ``obj`` on every rank of the set (``root_rank`` is a global rank).

    Raises:
        ValueError: not initialized, or this rank is not in the set.
        HorovodInternalError: a broadcast failed.
    """
    from .basics import rank

    name = type(obj).__name__ if name is None else name
    if rank() == root_rank:
        data = torch.ByteTensor(bytearray(_dumps(obj)))
        broadcast_(torch.IntTensor([data.shape[0]]), root_rank, name + ".sz", process_set)
    else:
        size = broadcast_(torch.IntTensor([0]), root_rank, name + ".sz", process_set)
        data = torch.ByteTensor(int(size[0]))
    broadcast_(data, root_rank, name + ".t", process_set)
    return obj if rank() == root_rank else cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None):
    """A list of every rank's ``obj``, in rank order.

    Raises:
        ValueError: not initialized.
        HorovodInternalError: a gather failed.
    """
    from .basics import size

    name = type(obj).__name__ if name is None else name
    data = torch.ByteTensor(bytearray(_dumps(obj)))
    sizes = allgather(torch.IntTensor([data.shape[0]]), name=name + ".sz").tolist()
    gathered = allgather(data, name=name + ".t").numpy()
    starts = [sum(sizes[:i]) for i in range(size())]
    return [cloudpickle.loads(gathered[s:s + n].tobytes()) for s, n in zip(starts, sizes)]


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    return buffer.getvalue()
