"""Horovod's ``horovod.torch`` API implemented on torch.distributed, so Horovod scripts run unchanged without a
Horovod build.

Use: ``import spark_dist.horovod.torch as hvd``; or call :func:`install_as_horovod` first and keep the script's
``import horovod.torch as hvd`` (see :mod:`spark_dist.horovod.aliases`). Importing this package imports no torch.

Contract
========

Follows Horovod 0.28.1: the public names of ``horovod.torch``, their signatures and defaults, the reduce op values
(Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5), ints as handles, the arithmetic of ``op``,
``prescale_factor`` and ``postscale_factor`` (an Average of integer tensors truncates toward zero, as Horovod's
does), the tensor types each collective takes, allgather's uneven first dimensions, reducescatter's split of
rows, root ranks as global ranks in process sets, and the errors for misuse (``ValueError`` before ``init()``,
for unsupported types, non-contiguous tensors, duplicate or unregistered process sets; ``AssertionError`` for
``zero_grad()`` with gradients in flight). A failed collective raises ``HorovodInternalError``. Before a
collective moves data, the ranks of its process set compare what each asks for, as Horovod's coordinator does
(:mod:`spark_dist.horovod.torch.negotiation`): ranks whose types, shapes, root ranks, reduction ops or scale
factors disagree all get ``HorovodInternalError`` from ``synchronize`` with Horovod's message. ``join()`` stands
in for the other ranks' collectives as Horovod's does (zeros in their allreduces; their other collectives fail).
Checked against Horovod's own test/parallel/test_torch.py and its PyTorch examples
(tests/unit/test_horovod_own_suite.py, ``make horovod-suite``).

Rendezvous: ``hvd.init()`` joins the default torch.distributed process group over gloo from the torchrun
variables spark_dist sets for every rank (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, or
``HOROVOD_RANK``/``HOROVOD_SIZE``), or reuses an initialized default group; local and cross ranks come from the
``HOROVOD_LOCAL_*``/``HOROVOD_CROSS_*`` variables, else from the ranks' hosts. Gloo only: collectives take CPU
tensors (NCCL for CUDA tensors is a later step).

Where it differs from Horovod, and how it shows:

* Collectives are matched across ranks by the order they are called in on each process set, not by ``name``
  (accepted, unused): every rank must issue them in the same order. Ranks that issue different collectives at
  the same point get ``HorovodInternalError("Mismatched operations: ...")`` (Horovod's message when ranks
  disagree on an op), where Horovod would wait for the named ops to pair up; two ops of the same kind, types and
  shapes issued in different orders pair silently. ``DistributedOptimizer`` keeps its gradient reductions in one
  fixed order on a group of their own, so it needs no such care.
* ``join()`` does not stand in for ``DistributedOptimizer``'s gradient reductions, nor for collectives on other
  process sets than the global one: ranks that issue those while another rank is in ``join()`` wait until
  torch's timeout and raise.
* ``SyncBatchNorm`` runs on CPU tensors (Horovod's needs CUDA).
* ``hvd.elastic`` changes the set of ranks through spark_dist's retries and elastic runs (``max_retries``,
  ``min_processes``), not Horovod's elastic driver: each ``state.commit()`` is also the run's checkpoint, and
  the next attempt's ``hvd.elastic.run`` starts the function again from it, on new processes, instead of a
  reset in place (see :mod:`spark_dist.horovod.torch.elastic`).
* ``shutdown()`` leaves torch's process groups up; a later ``init()`` reuses them.

Not covered, raising ``NotImplementedError`` that names the call and says to install horovod 0.28.1: the Adasum
op (collectives and ``DistributedOptimizer``), ``start_timeline``/``stop_timeline``, ``init(comm=...)`` with a
subset of the ranks, and collectives on non-CPU tensors. MPI communicators (``init(comm=...)``, ``ProcessSet``)
raise ``ValueError``, as a Horovod built without MPI does. Other Horovod modules (``horovod.tensorflow``,
``horovod.spark``, ``horovod.runner``) are not provided: importing them through the alias raises
``ModuleNotFoundError``.
"""
from .aliases import install_as_horovod, uninstall_horovod_alias

__version__ = "0.28.1"  # the Horovod API version this implements (scripts that check horovod.__version__ see it)
# Set in a rank's environment by backend="horovod" when this implementation runs its ranks: the rank installs
# the alias before the user's code imports horovod (spark_dist.task.rank_process).
IMPL_ENV = "SPARK_DIST_HOROVOD_IMPL"

__all__ = ["IMPL_ENV", "install_as_horovod", "uninstall_horovod_alias"]
