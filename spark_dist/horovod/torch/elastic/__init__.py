"""``hvd.elastic``: Horovod's elastic API (``run``, ``TorchState``, ``ElasticSampler``) in a minimal form.

What it does: ``hvd.elastic.run(fn)(state, ...)`` restores the run's last commit where an earlier attempt made
one, syncs ``state`` from rank 0 (so every rank starts from the same model, optimizer and counters), then calls
``fn(state, ...)`` and returns its result. ``state.commit()`` saves, and in a spark_dist run also checkpoints
the commit (rank 0, ``ctx.save_checkpoint``: :mod:`.checkpoint`); ``state.restore()`` rolls back to the last
commit, ``state.sync()`` re-syncs from rank 0, and ``state.on_reset()`` runs the registered reset callbacks.

How the set of ranks changes: through spark_dist's own retries and elastic runs, not Horovod's elastic driver
(``horovodrun --min-np/--max-np`` with a host discovery script). A lost rank fails the attempt (a failed
collective raises ``HorovodInternalError`` out of ``fn``); the next attempt, on the ranks the run gets
(``max_retries``; ``min_processes`` lets it go on with fewer), starts ``fn`` again from the last commit, an
``ElasticSampler`` in the state dealing what its epoch has left among the new ranks. That is what Horovod's
driver does with the workers left, by new processes instead of a reset in place. A grow or a preemption notice
ends the attempt at rank 0's next ``commit()`` (``spark_dist.RunResized`` where Horovod raises
``HostsUpdatedInterrupt``). Reset callbacks run only where a script calls ``state.on_reset()``: each attempt
starts its ranks afresh.
"""
import functools

from . import checkpoint
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState


def run(func):
    """Decorator for the elastic training function: ``run(func)(state, *args, **kwargs)`` restores the run's last
    checkpointed commit (an earlier attempt's), syncs ``state`` from rank 0, then returns
    ``func(state, *args, **kwargs)``. Collectives must not run before it (in Horovod, new workers would deadlock
    them); here they would not deadlock, but the rule keeps scripts portable.

    Raises:
        ValueError: Horovod is not initialized (from the sync).
        HorovodInternalError: a collective failed (the attempt fails; see the module's note for what follows).
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        checkpoint.resume(state)
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState"]
