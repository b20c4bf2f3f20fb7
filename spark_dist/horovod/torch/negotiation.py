"""What Horovod's coordinator checks before any collective moves data, and ``join``'s stand-in part in the other
ranks' collectives.

Before a script's collective moves data, the members of its process set compare requests: what each asks for
(the op, each tensor's type and shape, the reduction and its scale factors, the root rank). A request is sent as
a digest in one small all_gather; when digests differ, or a member is in ``join()``, the requests themselves
follow (``all_gather_object``) and every member draws the same verdict from them: Horovod's error message for
the first disagreement (its ``Controller::ConstructResponse`` checks, in its order and words), or go. So ranks
whose tensors disagree get ``HorovodInternalError`` from ``synchronize`` on every rank, as in Horovod, where a
collective over gloo would hang or reduce garbage; and ranks that issue different collectives at the same point
(which Horovod would match by name) get "Mismatched operations" instead of pairing them.

A member in ``join()`` answers each round with a JOIN request: an allreduce of the others then goes ahead with
zeros from it (it joins the reduction with zero tensors of the agreed shape and type), any other collective
fails with Horovod's "... is not supported with Join at this time." on the others, and a round where every
member is joined ends ``join()``.

DistributedOptimizer's gradient reductions are not negotiated (they run on a group of their own in one fixed
order, checked when the optimizer is built): a rank in ``join()`` does not stand in for them.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from . import engine

# Horovod's Request::RequestType values and names
ALLREDUCE, ALLGATHER, BROADCAST, JOIN, ADASUM, ALLTOALL, BARRIER, REDUCESCATTER = range(8)
KIND_NAMES = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "JOIN", "ADASUM", "ALLTOALL", "BARRIER", "REDUCESCATTER")
_NOT_WITH_JOIN = {
    ALLGATHER: "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if using "
               "DistributedOptimizer",
    ALLTOALL: "Alltoall is not supported with Join at this time.",
    REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
    BROADCAST: "Broadcast is not supported with Join at this time.",
}


@dataclass(frozen=True)
class Request:
    """One rank's request: ``tensors`` holds each tensor's (type name, shape); for allgather and alltoall the
    first dimension may differ across ranks and is left out of the digest. ``arrival`` orders ``join()``
    calls."""

    kind: int
    tensors: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    op: Optional[int] = None
    factors: Tuple[float, float] = (1.0, 1.0)
    root: Optional[int] = None
    arrival: int = field(default=0, compare=False)

    def digest(self) -> int:
        tensors = [(t, s[1:] if self.kind in (ALLGATHER, ALLTOALL) else s, len(s)) for t, s in self.tensors]
        described = repr((self.kind, tensors, self.op, self.factors, self.root)).encode()
        return int.from_bytes(hashlib.blake2b(described, digest_size=7).digest(), "big")


def request(kind: int, tensors: Sequence[torch.Tensor] = (), op=None, factors=(1.0, 1.0), root=None) -> Request:
    return Request(kind, tuple((str(t.dtype).replace("torch.", ""), tuple(t.shape)) for t in tensors), op,
                   (float(factors[0]), float(factors[1])), root)


def exchange(set_, mine: Request) -> Optional[List[Request]]:
    """Every member's request, in the set's rank order, or None when all sent the same and none is joined.
    Collective over the set's group."""
    import torch.distributed as dist

    if set_.size == 1:
        return None
    sent = torch.tensor([int(mine.kind == JOIN), mine.digest()], dtype=torch.int64)
    everyone = [torch.empty_like(sent) for _ in range(set_.size)]
    engine.run(lambda: dist.all_gather(everyone, sent, group=set_.group))
    if all(torch.equal(theirs, everyone[0]) for theirs in everyone) and not int(sent[0]):
        return None
    requests = [None] * set_.size
    engine.run(lambda: dist.all_gather_object(requests, mine, group=set_.group))
    return requests


def verdict(requests: List[Request]) -> Optional[str]:
    """Horovod's error for these requests (its checks, in its order), or None: go ahead. Joined members' requests
    count only for the "not supported with Join" errors."""
    active = [r for r in requests if r.kind != JOIN]
    if not active:
        return None
    first, kind = active[0], active[0].kind
    for other in active[1:]:
        if first.tensors and other.tensors and first.tensors[0][0] != other.tensors[0][0]:
            return (f"Mismatched data types: One rank had type {first.tensors[0][0]}, but another rank had type "
                    f"{other.tensors[0][0]}.")
        if other.kind != kind:
            return (f"Mismatched operations: One rank did an {KIND_NAMES[kind]}, but another rank did an "
                    f"{KIND_NAMES[other.kind]}.")
        if len(other.tensors) != len(first.tensors):
            return (f"Mismatched {KIND_NAMES[kind]} groups: One rank sent {len(first.tensors)} tensors, but "
                    f"another rank sent {len(other.tensors)}.")
        for (type_a, shape_a), (type_b, shape_b) in zip(first.tensors, other.tensors):
            error = _tensor_error(kind, type_a, shape_a, type_b, shape_b)
            if error:
                return error
        if kind in (ALLREDUCE, REDUCESCATTER) and other.factors != first.factors:
            return (f"Mismatched prescale and/or postscale factors: One rank sent factors ({first.factors[0]:g}, "
                    f"{first.factors[1]:g}), but another rank sent factors ({other.factors[0]:g}, "
                    f"{other.factors[1]:g}).")
        if kind == ALLREDUCE and other.op != first.op:
            return (f"Mismatched reduction operation: One rank sent reduction op {first.op}, but another rank sent "
                    f"reduction op {other.op}.")
        if kind == BROADCAST and other.root != first.root:
            return (f"Mismatched BROADCAST root ranks: One rank specified root rank {first.root}, but another rank "
                    f"specified root rank {other.root}.")
    if len(active) < len(requests) and kind in _NOT_WITH_JOIN:
        return _NOT_WITH_JOIN[kind]
    if kind in (ALLGATHER, ALLTOALL, REDUCESCATTER) and any(len(s) == 0 for _, s in first.tensors):
        return f"Process-set rank zero tried to {KIND_NAMES[kind]} a rank-zero tensor."
    return None


def _tensor_error(kind, type_a, shape_a, type_b, shape_b) -> Optional[str]:
    name = KIND_NAMES[kind]
    if type_a != type_b:
        return f"Mismatched data types: One rank had type {type_a}, but another rank had type {type_b}."
    if kind in (ALLREDUCE, BROADCAST, REDUCESCATTER) and shape_a != shape_b:
        return (f"Mismatched {name} tensor shapes: One rank sent a tensor of shape {list(shape_a)}, but another "
                f"rank sent a tensor of shape {list(shape_b)}.")
    if kind in (ALLGATHER, ALLTOALL):
        if len(shape_a) != len(shape_b):
            return (f"Mismatched {name} tensor shapes: One rank sent a tensor of rank {len(shape_a)}, but another "
                    f"rank sent a tensor of rank {len(shape_b)}.")
        for dim in range(1, len(shape_a)):
            if shape_a[dim] != shape_b[dim]:
                return (f"Mismatched {name} tensor shapes: One rank sent a tensor with dimension {dim} equal to "
                        f"{shape_a[dim]}, but another rank sent a tensor with dimension {dim} equal to "
                        f"{shape_b[dim]}.")
    return None


def negotiate(set_, mine: Request) -> Optional[str]:
    """Agree with the set's members on ``mine`` before moving data: None to go ahead, else the error every member
    gets (raise it from ``synchronize``, as Horovod does: see ``engine.failed``)."""
    requests = exchange(set_, mine)
    return None if requests is None else verdict(requests)


def stand_in(set_, requests: List[Request]) -> None:
    """A joined member's part in what the others agreed on: zeros for an allreduce (the same torch collectives,
    in the same order, as theirs); nothing for the rest."""
    import torch.distributed as dist

    if verdict(requests) is not None:
        return
    active = next(r for r in requests if r.kind != JOIN)
    if active.kind != ALLREDUCE:
        return
    reduction = engine.torch_op(active.op, "hvd.join")
    for type_name, shape in active.tensors:
        zeros = torch.zeros(shape, dtype=getattr(torch, type_name))
        engine.run(lambda z=zeros: dist.all_reduce(z, op=reduction, group=set_.group))
