"""What every collective shares: tensor checks, reduction ops, Horovod's scaling arithmetic, and the handle table
behind ``*_async``, ``poll`` and ``synchronize``.

A handle is an int, as in Horovod. Behind it: the torch.distributed works in flight and a ``finish`` step that
runs once they are done (postscaling, trimming padded rows) and gives the result. Any step a collective needs
before its data can move (agreeing on the request, see ``negotiation``; exchanging shapes or splits) runs at the
call itself, blocking; only the data transfer runs in the background. A collective the ranks did not agree on
gets a handle whose ``synchronize`` raises Horovod's error (``failed``).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Dict, List, Optional

import torch

from ..exceptions import HorovodInternalError

# Horovod's reduce op values (its C++ ReduceOp enum), so code that stores or compares them sees the same ints.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5

# What Horovod 0.28.1's torch extension accepts (its mpi_lib_v2 entry points, CPU tensor types): reductions
# take five types; moving data (allgather, broadcast, alltoall) three more. Bool and bfloat16 are refused there
# too.
REDUCE_DTYPES = (torch.float64, torch.float32, torch.float16, torch.int32, torch.int64)
MOVE_DTYPES = REDUCE_DTYPES + (torch.uint8, torch.int8, torch.int16)

INSTALL = "install horovod 0.28.1 for it"


def unsupported(call: str, why: str = "") -> NotImplementedError:
    """The error for a call this implementation does not cover: names the call and the way out."""
    reason = f" ({why})" if why else ""
    return NotImplementedError(f"{call} is not implemented by spark_dist's horovod.torch, which runs on "
                               f"torch.distributed over gloo{reason}; {INSTALL}")


def check_tensor(tensor: torch.Tensor, call: str, reduce: bool) -> None:
    """Refuse what Horovod refuses (type, layout) and what gloo cannot carry here (non-CPU tensors).

    Raises:
        NotImplementedError: the tensor is not on the CPU.
        ValueError: a type Horovod does not support for this kind of op, or a non-contiguous tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{call} takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise unsupported(f"{call} on a {tensor.device.type} tensor", "CPU tensors only; move it to the CPU")
    if tensor.dtype not in (REDUCE_DTYPES if reduce else MOVE_DTYPES) or tensor.is_sparse:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def wire(tensor: torch.Tensor) -> torch.Tensor:
    """A view of ``tensor`` gloo can carry, sharing its storage: int16, which gloo lacks, travels as its bytes
    (rows kept, so splits along dimension 0 still count rows); other types as they are. For ops that move data
    only."""
    if tensor.dtype != torch.int16:
        return tensor
    rows = tensor.shape[0] if tensor.dim() else 1
    return tensor.reshape(rows, math.prod(tensor.shape[1:])).view(torch.uint8)


def resolve_op(op, average) -> int:
    """Horovod's ``op``/``average`` rule: ``op`` wins, the deprecated ``average`` maps to Average or Sum, and
    Average is the default.

    Raises:
        ValueError: both were given.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average


def torch_op(op, call: str):
    """The torch.distributed reduction for a Horovod op (Average is a Sum, divided at the end).

    Raises:
        NotImplementedError: Adasum.
        ValueError: not one of Horovod's ops.
    """
    import torch.distributed as dist

    refuse_adasum(op, call)
    ops = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX,
           Product: dist.ReduceOp.PRODUCT}
    try:
        return ops[op]
    except (KeyError, TypeError):
        raise ValueError(f"{call}: unknown reduction op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or "
                         "hvd.Product") from None


def refuse_adasum(op, call: str) -> None:
    """Raises NotImplementedError for ``op=hvd.Adasum``, naming ``call``."""
    if op == Adasum:
        raise unsupported(f"{call}(op=hvd.Adasum)", "Adasum is a reduction of Horovod's own C++ core")


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply in place as Horovod's CPU ScaleBuffer does: floating types in their own precision with the factor
    rounded to it (fp16 through float32), integer types in double, truncated toward zero (so an Average of the
    ints 1 and 2 is 1, and of -1 and -2 is -1)."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point:
        return tensor.mul_(factor)
    return tensor.copy_(tensor.double().mul_(factor))  # double -> int conversion truncates, as C++ does


def run(launch: Callable[[], object]):
    """Call torch.distributed; its runtime errors (a peer gone, a broken connection) become
    ``HorovodInternalError``, what Horovod raises, so elastic code catches them by the same type."""
    try:
        return launch()
    except NotImplementedError:
        raise
    except RuntimeError as exc:
        raise HorovodInternalError(exc) from exc


class _Pending:
    __slots__ = ("works", "finish")

    def __init__(self, works: List[object], finish: Callable[[], object]):
        self.works = works
        self.finish = finish


_handles: Dict[int, _Pending] = {}
_last_handle = 0


def submit(works: List[object], finish: Callable[[], object]) -> int:
    """Register collectives in flight; returns their handle (ints count up from 1, never reused)."""
    global _last_handle
    _last_handle += 1
    _handles[_last_handle] = _Pending(works, finish)
    return _last_handle


def failed(message: str) -> int:
    """A handle for a collective the ranks did not agree on (see ``negotiation``): ``synchronize`` raises
    ``HorovodInternalError(message)``, as Horovod's does for its coordinator's errors; ``poll`` says done."""
    def finish():
        raise HorovodInternalError(message)

    return submit([], finish)


def reset_handles() -> None:
    """Forget every handle (``hvd.init()`` and ``hvd.shutdown()`` do, as Horovod's do)."""
    _handles.clear()


def poll(handle: int) -> bool:
    """Whether the operation behind ``handle`` has completed, so ``synchronize`` will not block.

    Raises:
        ValueError: the handle was never returned, or was already synchronized.
    """
    pending = _handles.get(handle)
    if pending is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return all(work.is_completed() for work in pending.works)


def synchronize(handle: int):
    """Wait for the operation behind ``handle`` and return its result: a tensor, or a tuple of them for grouped
    ops and ``alltoall_async`` (output, received splits). ``None`` for a handle not known (Horovod's behaviour).

    Raises:
        HorovodInternalError: the collective failed.
    """
    pending: Optional[_Pending] = _handles.pop(handle, None)
    if pending is None:
        return None
    for work in pending.works:
        run(work.wait)
    return pending.finish()
