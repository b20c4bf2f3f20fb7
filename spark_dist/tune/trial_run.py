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

from ..driver import tracking
from ..driver.distributor import Distributor
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
        if self.steps and step <= self.steps[-1]:  # Optuna keeps the first value of a step
            step = self.steps[-1] + 1
        self.steps.append(step)
        self.trial.report(value, step)
        if self.trial.should_prune():
            import optuna

            self.pruned_at = step
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step} ({self.metric}={value:g})")

    def _on_progress(self, progress) -> None:
        super()._on_progress(progress)
        if self._stop.is_set():
            raise Stopped(f"trial {self.trial.number}: the study was interrupted")

    def stop(self, spark) -> None:
        """From another thread: end this run (its next report or progress ends the watch; its job is
        cancelled now, which a run treats as the user's cancel: no retry)."""
        self._stop.set()
        run_id = self.last_run_id
        if run_id is None or spark is None or self._args["local_mode"]:
            return
        if self._lane is not None:
            self._lane.cancel()
            return
        for attempt in range(self._args["max_retries"] + 1):
            try:
                session.cancel(spark, f"spark_dist-{run_id}-{attempt}")
            except Exception:  # noqa: BLE001 -- the session may be going down with the interrupt
                pass
