"""An ``hvd.elastic`` commit as the spark_dist run's checkpoint, so that the next attempt goes on from it.

Horovod's elastic driver keeps its workers' processes alive and restores their last commit in memory when the
set of workers changes. A spark_dist attempt that lost a rank, or changes its size (``min_processes``, a grow, a
preemption notice), ends instead, and the next starts the ranks afresh: what carries the last commit across is
rank 0's checkpoint of the run (``ctx.save_checkpoint``), written at each ``state.commit()`` and read back by
``hvd.elastic.run`` before it syncs the state, once a process (a later decorated function of the same attempt,
an evaluation after the training, goes on from where the training left its state, as in Horovod). Outside a
spark_dist run nothing is written or read.

The commit is the run's checkpoint: a script that also calls ``ctx.save_checkpoint`` itself writes over it (and
the other way round), so use one or the other. A state holding what pickle cannot write (a lambda) is not
checkpointed: one warning says so, and a retry then starts from the beginning.
"""
import pickle
import sys
from typing import Optional

from ... import run_checkpoint

KEY = "horovod_elastic_state"  # the checkpoint's entry holding the commit (State.committed())
_resumed = False  # hvd.elastic.run restored the run's commit in this process already
_warned = False  # a state that cannot be pickled was told once


def persist(committed: dict) -> None:
    """Checkpoint ``committed`` as the run's latest (rank 0 writes it; the other ranks return at once).

    Raises:
        spark_dist.RunResized: on rank 0, the driver asked the run to change its size (from this checkpoint).
    """
    global _warned
    hooks = run_checkpoint.attached()
    if hooks is None:
        return
    try:
        hooks[0]({KEY: committed})
    except (pickle.PicklingError, AttributeError, TypeError) as exc:  # what torch.save raises for such objects
        if not _warned:
            _warned = True
            sys.stderr.write(f"spark_dist: WARNING: hvd.elastic cannot checkpoint this state ({exc}); its commits "
                             "stay in memory, and a retry or a resize starts from the beginning\n")


def resume(state) -> Optional[dict]:
    """Make the run's checkpointed commit, if any (an earlier attempt's, or a resumed run's), ``state``'s last
    commit and its current values, the first time in this process; returns it, else ``None``. ``state.sync()``
    then gives every rank rank 0's."""
    global _resumed
    hooks = run_checkpoint.attached()
    if hooks is None or _resumed:
        return None
    _resumed = True
    saved = hooks[1]()
    if not isinstance(saved, dict) or not isinstance(saved.get(KEY), dict):
        return None
    state.load_committed(saved[KEY])
    state.restore()
    return saved[KEY]
