"""One trial as one run: a :class:`~spark_dist.driver.distributor.Distributor` whose rank-0 reports of the
study's metric reach ``trial.report`` and the pruner.

A pruned trial's run ends the way a run the caller gave up on ends: :class:`optuna.TrialPruned` raised from the
report hook leaves the attempt's watch loop, which aborts the ranks through the store; their tasks return and
the job ends (it is cancelled only if a task does not return in time) before the exception goes on to Optuna,
which records ``PRUNED``. The slots are free once the job has ended. A trial on a lane
(:mod:`spark_dist.driver.lanes`) ends the same way, its lane's tasks then free for the next trial. Under Spark Connect the reports reach the
client with the job's end, so there a trial is judged by the pruner only once its run is over (no job is cut
short).
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from ..config import RunConfig
from ..driver import tracking
from ..driver.distributor import Distributor
from ..errors import RankFailure
from ..spark import session
from .objective import reported, step_of


class Stopped(KeyboardInterrupt):
    """The study was interrupted (Ctrl-C on the driver) while this trial ran: a KeyboardInterrupt, so that
    Optuna fails the trial and ends the study whatever its ``catch``."""


class TrialRun(Distributor):
    """A Distributor for one Optuna trial.

    Args:
        trial: the ``optuna.Trial`` this run is.
        metric: the report key fed to ``trial.report`` (``None``: no pruning, values from the return value).
        lane: the :class:`~spark_dist.driver.lanes.LaneHandle` whose tasks serve this run (``None``: each
            attempt is a barrier job of its own).
        distributor_args: the Distributor's own arguments.
    """

    def __init__(self, trial, metric: Optional[str], lane=None, **distributor_args):
        super().__init__(**distributor_args)
        self.trial, self.metric = trial, metric
        self._lane = lane  # its attempts run on this lane (spark_dist.driver.lanes); None: jobs of their own
        self.steps: List[int] = []  # the steps reported to the trial, in order
        self.last_value: Optional[float] = None
        self.pruned_at: Optional[int] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._tags: List[str] = []  # the job tag of every attempt this run started: what stop() cancels

    def _on_report(self, record: Dict[str, Any]) -> None:
        super()._on_report(record)
        if self._stop.is_set():
            raise Stopped(f"trial {self.trial.number}: the study was interrupted")
        if self.metric is None or record.get("rank") != 0:
            return
        value = reported(record, self.metric)
        if value is None:
            return
        step = step_of(record, tracking._STEP_KEYS, self.steps)
        self.last_value = value
        if step in self.steps:
            # A retry going over its epochs again from a checkpoint (the same values), or a report repeating its
            # step: Optuna keeps a step's first value (trial.report ignores another), and the pruner has judged
            # it. Moved to a step of its own, it would put one epoch's value at another's.
            return
        self.steps.append(step)
        self.trial.report(value, step)
        if self.trial.should_prune():
            import optuna

            self.pruned_at = step
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step} ({self.metric}={value:g})")

    def _on_progress(self, progress) -> None:
        super()._on_progress(progress)
        self._on_poll()

    def _on_poll(self) -> None:
        if self._stop.is_set():
            raise Stopped(f"trial {self.trial.number}: the study was interrupted")

    def _attempt_started(self, config: RunConfig, attempt: int, size: int, previous_size: int,
                         failures: List[RankFailure]) -> None:
        # Recorded before the check: a stop() from now on cancels this attempt's job; one before it, none starts.
        with self._lock:
            self._tags.append(config.job_tag(attempt))
        if self._stop.is_set():
            raise Stopped(f"trial {self.trial.number}: the study was interrupted")
        super()._attempt_started(config, attempt, size, previous_size, failures)

    def stop(self, spark) -> None:
        """From another thread: end this run. The attempt running now ends at the driver's next look at it
        (its ranks aborted through the store, as a pruned trial's), its job is cancelled now (which a run treats as the user's cancel: no retry),
        and no further attempt starts. Every attempt the run started is cancelled by its job tag: retries,
        restarts after a preemption and elastic resizes alike."""
        self._stop.set()
        if spark is None or self._args["local_mode"]:
            return
        if self._lane is not None:
            self._lane.cancel()
            return
        with self._lock:
            tags = list(self._tags)
        for tag in tags:
            try:
                session.cancel(spark, tag)
            except Exception:  # noqa: BLE001 -- the session may be going down with the interrupt
                pass
