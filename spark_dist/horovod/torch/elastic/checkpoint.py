"""An ``hvd.elastic`` commit as the spark_dist run's checkpoint, so that the next attempt goes on from it.

Horovod's elastic driver keeps its workers' processes alive and restores their last commit in memory when the
set of workers changes. A spark_dist attempt that lost a rank, or changes its size (``min_processes``, a grow, a
preemption notice), ends instead, and the next starts the ranks afresh: what carries the last commit across is
rank 0's checkpoint of the run (``ctx.save_checkpoint``), written at each ``state.commit()`` and read back by
``hvd.elastic.run`` before it syncs the state. Outside a spark_dist run nothing is written or read.
"""
from typing import Optional

KEY = "horovod_elastic_state"  # the checkpoint's entry holding the commit (State.committed())


def _context():
    from spark_dist.task.context import get_context

    try:
        return get_context()
    except RuntimeError:  # not in a spark_dist run
        return None


def persist(committed: dict) -> None:
    """Checkpoint ``committed`` as the run's latest (rank 0 writes it; the other ranks return at once).

    Raises:
        spark_dist.RunResized: on rank 0, the driver asked the run to change its size (from this checkpoint).
    """
    ctx = _context()
    if ctx is not None:
        ctx.save_checkpoint({KEY: committed})


def resume(state) -> Optional[dict]:
    """Make the run's checkpointed commit, if any (an earlier attempt's, or a resumed run's), ``state``'s last
    commit and its current values; returns it, else ``None``. ``state.sync()`` then gives every rank rank 0's."""
    ctx = _context()
    if ctx is None:
        return None
    saved = ctx.load_checkpoint()
    if not isinstance(saved, dict) or not isinstance(saved.get(KEY), dict):
        return None
    state.load_committed(saved[KEY])
    state.restore()
    return saved[KEY]
