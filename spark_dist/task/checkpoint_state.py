"""What a sharded checkpoint holds of the live objects a training function passes, and how they get it back.

``ctx.save_checkpoint({"model": model, "optimizer": optimizer, "loader": loader, "step": step})`` takes the
training's own objects; this module turns them into the state dict ``torch.distributed.checkpoint`` (DCP)
writes, and a loaded one back into them:

- an ``nn.Module``: ``get_model_state_dict`` (FSDP2 / DTensor parameters stay sharded; a DDP or plain module's
  full tensors, which DCP writes once however many ranks hold them); restored with ``set_model_state_dict``;
- a ``torch.optim.Optimizer``: ``get_optimizer_state_dict`` of the state's one module (keyed by parameter
  names, so it reshards with the model); restored with ``set_optimizer_state_dict``;
- anything else with ``state_dict()`` and ``load_state_dict()`` (a spark_dist loader, an LR scheduler, a
  ``GradScaler``): its state dict, pickled whole into one value and given back through ``load_state_dict``.
  Whole, because DCP loads a dict only into the keys of the one it is given, a fresh object's: a loader's
  place inside an epoch dealt out after a resize carries keys (its ``origin``) that a fresh loader's lacks;
- tensors, DTensors, numbers, strings and containers of them: as they are.

torch's ``state_dict`` helpers are the library that already does this job (FQN keys, FSDP2, DDP prefixes,
optimizer state initialised before a first step), so nothing here re-implements them.
"""
from __future__ import annotations

import pickle
from typing import Any, Dict, Mapping, Optional, Tuple

_STATE_BLOB = b"spark_dist state_dict\n"  # heads a stateful object's pickled state dict in a checkpoint


def unpickled_state(value: Any) -> Any:
    """A stateful object's state dict back from its saved form; any other value as it is."""
    if isinstance(value, bytes) and value.startswith(_STATE_BLOB):
        return pickle.loads(value[len(_STATE_BLOB):])
    return value


def _kinds(state: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """``(modules, optimizers, stateful)`` of ``state``'s top-level values, by key."""
    import torch

    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    optimizers = {k: v for k, v in state.items() if isinstance(v, torch.optim.Optimizer)}
    stateful = {k: v for k, v in state.items() if k not in modules and k not in optimizers
                and callable(getattr(v, "state_dict", None)) and callable(getattr(v, "load_state_dict", None))}
    return modules, optimizers, stateful


def _only_module(modules: Dict[str, Any], optimizers: Dict[str, Any]):
    """The module the state's optimizers step.

    Raises:
        ValueError: optimizers beside no module or several (their state is keyed by the module's parameter
            names, so it must be clear which module that is).
    """
    if optimizers and len(modules) != 1:
        raise ValueError(f"save_checkpoint: an optimizer ({', '.join(map(repr, optimizers))}) needs exactly one "
                         f"module beside it in the state, found {len(modules)}; save several models as separate "
                         "states, or pass their state dicts yourself")
    return next(iter(modules.values()), None)


def has_sharded_tensors(value: Any) -> bool:
    """Whether ``value`` (a state as given to ``save_checkpoint``) holds DTensors, in a module's parameters or
    anywhere in nested dicts, lists and tuples: such a state can only be saved sharded."""
    from torch.distributed.tensor import DTensor
    import torch

    if isinstance(value, DTensor):
        return True
    if isinstance(value, torch.nn.Module):
        return any(isinstance(p, DTensor) for p in value.parameters())
    if isinstance(value, Mapping):
        return any(has_sharded_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_sharded_tensors(v) for v in value)
    return False


def to_saved(state: Mapping[str, Any], stored: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The state dict DCP writes for ``state`` (see the module's docstring), or loads into. ``stored``: the
    keys of the checkpoint to load, where a stateful object's state saved by an earlier spark_dist, a dict
    DCP flattened, is loaded as such.

    Raises:
        TypeError: ``state`` is not a dict with string keys.
        ValueError: optimizers without exactly one module.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    _check_keys(state)
    modules, optimizers, stateful = _kinds(state)
    module = _only_module(modules, optimizers)
    saved = {}
    for key, value in state.items():
        if key in modules:
            saved[key] = get_model_state_dict(value)
        elif key in optimizers:
            saved[key] = get_optimizer_state_dict(module, value)
        elif key in stateful:
            flattened = stored is not None and key not in stored
            saved[key] = value.state_dict() if flattened else _STATE_BLOB + pickle.dumps(value.state_dict())
        else:
            saved[key] = value
    return saved


def restore(state: Mapping[str, Any], loaded: Mapping[str, Any]) -> Dict[str, Any]:
    """Give ``state``'s live objects what ``loaded`` (DCP's load of :func:`to_saved`'s dict) holds; return the
    state with its plain values replaced by the loaded ones (modules, optimizers and the like: the same objects,
    restored in place)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    modules, optimizers, stateful = _kinds(state)
    module = _only_module(modules, optimizers)
    restored = dict(state)
    for key, value in state.items():
        if key in modules:
            set_model_state_dict(value, loaded[key])
        elif key in optimizers:
            set_optimizer_state_dict(module, value, loaded[key])
        elif key in stateful:
            value.load_state_dict(unpickled_state(loaded[key]))
        else:
            restored[key] = loaded[key]
    return restored


def _check_keys(state: Any) -> None:
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise TypeError("save_checkpoint(sharded=True) takes a dict with string keys (e.g. {'model': model, "
                        f"'optimizer': optimizer, 'loader': loader}}), got {type(state).__name__}")
