"""Rank 0's return value on its way to the driver: tensors moved to the CPU, the size checked first.

The driver may have no GPU (it usually has none), so a state dict of CUDA tensors pickled as it is would
fail to load there after the training succeeded; every tensor is pickled as its CPU copy instead. The
result travels back with the Spark task, so Spark's ``spark.driver.maxResultSize`` bounds it: a result
over that bound is refused in the rank, by name, before Spark would fail the job (which looks like a
lost task and would be retried, training again for nothing).
"""
from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from ..config import MAX_RESULT_SIZE_CONF, parse_size  # noqa: F401 -- importable from here as before
# What the task adds around the pickled value (record framing, other ranks' empty results).
_OVERHEAD_BYTES = 1 << 20


class ResultTooLargeError(RuntimeError):
    """Rank 0's return value is larger than ``spark.driver.maxResultSize`` allows (not retried)."""


def _cpu_pickler(buffer):
    import cloudpickle

    class CpuPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            torch = sys.modules.get("torch")  # a rank that never imported torch has no tensors
            if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
                on_cpu = obj.detach().cpu()
                if isinstance(obj, torch.nn.Parameter):  # a returned module's weights stay Parameters
                    on_cpu = torch.nn.Parameter(on_cpu, requires_grad=obj.requires_grad)
                return on_cpu.__reduce_ex__(self.proto)
            return super().reducer_override(obj)

    return CpuPickler(buffer, protocol=pickle.DEFAULT_PROTOCOL)


def encode_result(value: Any, max_bytes: int = 0) -> bytes:
    """``value`` pickled (cloudpickle) with every tensor on the CPU.

    Raises:
        ResultTooLargeError: the pickle is larger than ``max_bytes`` allows (0: no bound), naming
            ``spark.driver.maxResultSize``.
    """
    buffer = io.BytesIO()
    _cpu_pickler(buffer).dump(value)
    data = buffer.getvalue()
    if max_bytes and len(data) + _OVERHEAD_BYTES > max_bytes:
        raise ResultTooLargeError(
            f"rank 0 returned {len(data) / 2**20:.1f} MiB, more than {MAX_RESULT_SIZE_CONF} "
            f"({max_bytes / 2**20:.0f} MiB) lets a task send to the driver: raise {MAX_RESULT_SIZE_CONF} "
            "(0 means no limit), or return less and save the rest with ctx.save_checkpoint or to storage")
    return data


__all__ = ["ResultTooLargeError", "encode_result", "parse_size", "MAX_RESULT_SIZE_CONF"]
