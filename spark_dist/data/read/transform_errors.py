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


def not_started(dataset: str, worker: int, limit: float, epoch: int, index: int) -> TransformError:
    """A worker that never came up within ``limit`` seconds, while batch ``index`` of ``epoch`` waited for it."""
    return TransformError(
        f"dataset {dataset!r}: transform worker {worker} did not start within {limit:g} s (it was to transform "
        f"batch {index} of epoch {epoch}), so the transform workers were stopped; something its start imports may "
        "hang (a module on an unreachable filesystem)", dataset, epoch, index)


def too_slow(dataset: str, pid: int, timeout: float, epoch: int, index: int) -> TransformError:
    """Worker process ``pid`` spent more than ``timeout`` seconds on batch ``index`` of ``epoch``."""
    return TransformError(
        f"dataset {dataset!r}: transform worker process {pid} did not finish batch {index} of epoch {epoch} within "
        f"timeout={timeout:g} s, so the transform workers were stopped; if a batch can take that long, pass a "
        "larger timeout= (None: no limit)", dataset, epoch, index)


def out_of_step(dataset: str, pid: int, due: int, answered: int) -> RuntimeError:
    """Worker process ``pid`` answered batch ``answered`` when ``due`` was: its stream cannot be trusted."""
    return RuntimeError(
        f"dataset {dataset!r}: transform worker process {pid} answered batch {answered} when batch {due} was due "
        "(its answers are out of step with the batches sent), so the transform workers were stopped")


def died(dataset: str, pid: int, how: str, epoch: Optional[int], index: Optional[int]) -> TransformError:
    """Worker process ``pid`` ended (``how``: by which signal or exit code), holding batch ``index`` if any."""
    doing = f" while transforming batch {index} of epoch {epoch}" if index is not None else ""
    return TransformError(f"dataset {dataset!r}: transform worker process {pid} {how}{doing}; its output above "
                          "may say why", dataset, epoch, index)
