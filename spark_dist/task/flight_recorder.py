"""PyTorch's NCCL Flight Recorder for a stall's diagnosis. A rank on GPUs runs with it on (its ring of the
latest collectives: ``TORCH_NCCL_TRACE_BUFFER_SIZE``, unless the user set it), and a thread of the rank writes
its dump when the supervisor asks with a request file in the rank's work directory. A thread, because a rank
stalled in a collective runs no Python on its main thread; the dump is torch's own
(``torch._C._distributed_c10d._dump_nccl_trace()``, a pickle its ``fr_trace`` tool reads)."""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from ..host.tempdirs import write_private

REQUEST, DUMP = "nccl_dump_wanted", "nccl_trace.pkl"
TRACE_ENTRIES = "2000"  # the collectives each rank keeps: torch's documented example size
MAX_DUMP_BYTES = 8 << 20  # what a rank's dump may take to the driver
ASK_S = 2.0


def start(workdir: str) -> None:
    """In the rank, before its process group exists: turn the recorder on and answer the supervisor's asks."""
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", TRACE_ENTRIES)
    request = os.path.join(workdir, REQUEST)

    def answer():
        while True:
            time.sleep(0.2)
            if os.path.exists(request):
                os.unlink(request)
                try:
                    write_private(os.path.join(workdir, DUMP), _dump())
                except Exception as exc:  # noqa: BLE001 -- no NCCL group yet, a torch without the recorder
                    write_private(os.path.join(workdir, DUMP), f"no dump: {type(exc).__name__}: {exc}".encode())

    threading.Thread(target=answer, daemon=True, name="spark_dist-flight-recorder").start()


def _dump() -> bytes:
    import torch

    return torch._C._distributed_c10d._dump_nccl_trace()


def ask(workdir: str) -> Optional[bytes]:
    """In the supervisor: the rank's dump, or None when it gave none within ASK_S (or it was too large)."""
    dump = os.path.join(workdir, DUMP)
    if os.path.exists(dump):
        os.unlink(dump)
    with open(os.path.join(workdir, REQUEST), "wb"):
        pass
    deadline = time.monotonic() + ASK_S
    while time.monotonic() < deadline:
        if os.path.exists(dump):
            with open(dump, "rb") as f:
                data = f.read(MAX_DUMP_BYTES + 1)
            return data if len(data) <= MAX_DUMP_BYTES else None
        time.sleep(0.05)
    return None
