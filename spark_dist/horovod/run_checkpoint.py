"""Where ``hvd.elastic`` keeps a commit across a spark_dist run's attempts: the run's checkpoint, reached through the
two functions the rank's process attaches here when it runs Horovod's API on torch.distributed
(:func:`spark_dist.task.rank_process.child_main`). The rank's API lives in a layer above this package; attaching
keeps the dependency pointing down. Nothing is attached outside a spark_dist run (Horovod's own launcher), and
then nothing is saved or restored. Imports no torch.
"""
from typing import Any, Callable, Optional, Tuple

_attached: Optional[Tuple[Callable[[Any], None], Callable[[], Any]]] = None


def attach(save: Callable[[Any], None], load: Callable[[], Any]) -> None:
    """``save(obj)`` checkpoints ``obj`` as the run's latest (``ctx.save_checkpoint``: rank 0 writes); ``load()``
    returns the run's latest checkpoint or ``None`` (``ctx.load_checkpoint``)."""
    global _attached
    _attached = (save, load)


def attached() -> Optional[Tuple[Callable[[Any], None], Callable[[], Any]]]:
    """``(save, load)`` in a spark_dist rank, else ``None``."""
    return _attached
