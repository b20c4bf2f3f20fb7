"""Horovod's exception types (``horovod.common.exceptions``), torch-free so that ``install_as_horovod`` can alias
``horovod.common.exceptions`` without importing torch.

Elastic training code catches these by type: a failed collective raises :class:`HorovodInternalError` here as it
does in Horovod, so ``except hvd.HorovodInternalError`` keeps working.
"""


class HorovodInternalError(RuntimeError):
    """A collective failed (a peer left, a connection broke, ranks disagreed on a tensor's shape).

    Raised by ``synchronize`` and by every blocking collective; the torch.distributed error is its ``__cause__``
    and its first argument, as Horovod passes the C++ error.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod raises this when hosts join or leave an elastic job. Kept for ``except`` clauses: this
    implementation never resizes a job, so it never raises it (see :mod:`spark_dist.horovod.torch.elastic`)."""

    def __init__(self, skip_sync):
        super().__init__(skip_sync)
        self.skip_sync = skip_sync
