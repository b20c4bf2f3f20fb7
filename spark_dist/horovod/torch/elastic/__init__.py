"""``hvd.elastic``: Horovod's elastic API (``run``, ``TorchState``, ``ElasticSampler``) in a minimal form.

What it does: ``hvd.elastic.run(fn)(state, ...)`` syncs ``state`` from rank 0 (so every rank starts from the same
model, optimizer and counters), then calls ``fn(state, ...)`` once and returns its result. ``state.commit()``
saves, ``state.restore()`` rolls back to the last commit, ``state.sync()`` re-syncs from rank 0, and
``state.on_reset()`` runs the registered reset callbacks.

What elastic resize does not do yet: the set of ranks never changes while ``fn`` runs. Horovod's elastic driver
(``horovodrun --min-np/--max-np`` with a host discovery script) is not involved, so no worker joins or leaves,
``HostsUpdatedInterrupt`` is never raised, ``commit()`` checks for no host changes, and reset callbacks never run
by themselves. A failed collective raises ``HorovodInternalError`` out of ``fn`` instead of restoring the last
commit and retrying with the surviving ranks: the spark_dist run fails that attempt, and retries the whole run
where its configuration allows. For real elastic resizing, install horovod 0.28.1 and run under its elastic
driver.
"""
import functools

from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState


def run(func):
    """Decorator for the elastic training function: ``run(func)(state, *args, **kwargs)`` syncs ``state`` from
    rank 0, then returns ``func(state, *args, **kwargs)``. Collectives must not run before it (in Horovod, new
    workers would deadlock them); here they would not deadlock, but the rule keeps scripts portable.

    Raises:
        ValueError: Horovod is not initialized (from the sync).
        HorovodInternalError: a collective failed (nothing is retried; see the module's note).
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState"]
