"""The errors of a user transform run over a loader's batches (:mod:`.transform_workers`), and the check of
its ``timeout`` argument."""
from typing import Optional

from ...errors import DatasetError


class TransformError(DatasetError):
    """A transform failed on a batch (or its worker process died, or took longer than the timeout). The
    message names the dataset, the epoch and the batch's index in it, and holds the worker's traceback; so do
    ``dataset``, ``epoch``, ``batch`` and ``worker_traceback``."""

    def __init__(self, message: str, dataset: Optional[str] = None, epoch: Optional[int] = None,
                 batch: Optional[int] = None, worker_traceback: str = ""):
        super().__init__(message, dataset)
        self.epoch, self.batch, self.worker_traceback = epoch, batch, worker_traceback

    def __reduce__(self):  # keep the fields when a rank's error travels to the driver
        return type(self), (str(self), self.dataset, self.epoch, self.batch, self.worker_traceback)


class TransformPickleError(DatasetError, TypeError):
    """The transform (or ``collate``) cannot be pickled to send it to the worker processes. Both a
    :class:`DatasetError` naming the dataset and a ``TypeError``, which is what pickling raises."""


def check_timeout(timeout, dataset: str) -> None:
    """Raises ValueError: ``timeout`` is neither None nor a number of seconds above 0."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"dataset {dataset!r}: timeout={timeout!r}: need the seconds a batch may take in a "
                         "transform worker (a number above 0), or None for no limit")
