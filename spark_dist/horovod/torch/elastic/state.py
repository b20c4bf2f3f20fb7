"""Elastic state: what ``hvd.elastic.run`` syncs from rank 0 and what ``restore()`` rolls back to.

``TorchState(model=..., optimizer=..., **others)``: models and optimizers are saved as deep copies of their
``state_dict()`` and synced with ``broadcast_parameters``/``broadcast_optimizer_state``; an
:class:`ElasticSampler` through its own state; everything else is a plain attribute, saved by reference and synced
with ``broadcast_object``. ``commit()`` saves; ``restore()`` goes back to the last save; ``sync()`` makes every
rank hold rank 0's values (collective).
"""
from __future__ import annotations

import copy
import queue

import torch

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from . import checkpoint
from .sampler import ElasticSampler


class State:
    """Horovod's base state: ``commit``/``restore``/``sync`` and reset callbacks.

    Args:
        bcast_object: broadcasts a picklable object from rank 0.
        get_rank: returns this process's rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions ``on_reset()`` calls, in order (Horovod calls it after workers join or leave; this
        implementation never resizes, so only a script's own ``state.on_reset()`` runs them)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Run ``reset()``, then every registered reset callback."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Save the state (a later ``restore()`` comes back here). In a spark_dist run the commit is also rank 0's
        checkpoint of the run (``ctx.save_checkpoint``), which ``hvd.elastic.run`` restores in the next attempt:
        after a lost rank (``max_retries``) or a change of size (``min_processes``), as Horovod's elastic driver
        restores the last commit on its new set of workers. Where the driver asked the run to change its size
        (a grow, a preemption notice), rank 0 raises ``spark_dist.RunResized`` here once the commit is saved, as
        Horovod raises ``HostsUpdatedInterrupt``; the next attempt starts from it.

        Raises:
            spark_dist.RunResized: on rank 0, the run changes its size from this commit.
        """
        self.save()
        checkpoint.persist(self.committed())
        self.check_host_updates()

    def committed(self) -> dict:
        """The last commit, as ``commit`` checkpoints it: picklable copies of what ``restore()`` returns to."""
        return {}

    def load_committed(self, saved: dict) -> None:
        """Make ``saved`` (what :meth:`committed` returned, in an earlier attempt) the last commit."""

    def check_host_updates(self):
        """Never raises HostsUpdatedInterrupt: the set of ranks does not change (see ``hvd.elastic.run``)."""

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Reset objects and variables following a reset event (before synchronization)."""


class ObjectState(State):
    """State of plain Python attributes, given as keyword arguments."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def committed(self) -> dict:
        return {"attributes": dict(self._saved_state)}

    def load_committed(self, saved: dict) -> None:
        self._saved_state.update(saved.get("attributes", {}))

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class _Handler:
    """Saves, restores and syncs one stateful object through its ``state_dict()``."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def set_value(self, value):
        self.value = value
        self.save()


class _ModelHandler(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self):
        # rank 0's progress wins; the sampler then repartitions what is left among the current ranks
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
                     (ElasticSampler, _SamplerHandler)]


class TorchState(ObjectState):
    """State of a PyTorch training process: ``model``, ``optimizer`` and any other keyword arguments, each
    available as an attribute of the same name.

    Raises:
        ValueError: (on ``sync``) Horovod is not initialized.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        from ..basics import rank

        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = next((h(value) for kind, h in _handler_registry if isinstance(value, kind)), None)
            if handler is None:
                plain[name] = value
            else:
                self._handlers[name] = handler
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def committed(self) -> dict:
        return {**super().committed(), "objects": {name: h.saved for name, h in self._handlers.items()}}

    def load_committed(self, saved: dict) -> None:
        for name, state_dict in saved.get("objects", {}).items():
            if name in self._handlers:
                self._handlers[name].saved = state_dict
        super().load_committed(saved)

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
