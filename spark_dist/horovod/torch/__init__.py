"""``horovod.torch``'s API (Horovod 0.28.1) on torch.distributed over gloo: ``import spark_dist.horovod.torch as
hvd``, or ``import horovod.torch as hvd`` after :func:`spark_dist.horovod.install_as_horovod`.

See :mod:`spark_dist.horovod` for the contract: what matches Horovod, what differs, what is not covered.
"""
from . import elastic
from .basics import (Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, barrier, ccl_built, cross_rank,
                     cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_initialized, join,
                     local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                     rocm_built, shutdown, size, start_timeline, stop_timeline)
from .compression import Compression
from .engine import poll, synchronize
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .gather import (allgather, allgather_async, broadcast, broadcast_, broadcast_async, broadcast_async_,
                     grouped_allgather, grouped_allgather_async, sparse_allreduce_async)
from .optimizer import DistributedOptimizer
from .reductions import (allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce,
                         grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .scatter import (alltoall, alltoall_async, grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                      reducescatter_async)
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    "elastic", "Compression", "DistributedOptimizer", "SyncBatchNorm", "HorovodInternalError",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "allgather_object", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "join", "barrier", "poll", "synchronize", "init", "shutdown", "is_initialized",
    "start_timeline", "stop_timeline", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product",
]
