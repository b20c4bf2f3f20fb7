"""A study in MLflow: one parent run for the study, one child run per trial (its parameters, rank 0's reported
metrics at their steps, its value and state), when MLflow is in use on the driver (as for a single run: see
:mod:`spark_dist.driver.tracking`, which logs each trial's run into its child).

MLflow keeps the active run per thread, and each trial runs in a thread of its own: its child run is started
there, under the parent's id, so the trial's Distributor finds it active and logs into it, leaving it open;
it is ended here with the trial's state. Logging never fails a study: an MLflow error is one warning.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from ..driver import tracking

log = logging.getLogger("spark_dist")

# The child run's status for each way a trial ends (MLflow has no "pruned": a pruned run was killed early).
_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}


class StudyRuns:
    """The study's parent run; :meth:`trial` opens a child. A no-op when MLflow is not in use."""

    def __init__(self, study, settings: Dict[str, Any]):
        self.mlflow = tracking._mlflow()
        self.parent_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._started = False
        if self.mlflow is None:
            return
        try:
            active = self.mlflow.active_run()
            if active is None:
                active = self.mlflow.start_run(run_name=study.study_name)
                self._started = True
            self.parent_id, self.experiment_id = active.info.run_id, active.info.experiment_id
            self.mlflow.set_tags({"optuna.study_name": study.study_name})
            self.mlflow.log_params({k: v for k, v in settings.items() if v is not None})
        except Exception as exc:  # noqa: BLE001 -- tracking is a side channel
            self._give_up(exc)

    def trial(self, trial) -> "TrialRunLog":
        """Start the trial's child run in this (the trial's) thread."""
        return TrialRunLog(self, trial)

    def end(self, study, failed: bool = False) -> None:
        """The best trial so far on the parent; the parent ended if it was started here."""
        if self.mlflow is None:
            return
        try:
            client = self.mlflow.MlflowClient()
            if len(study.directions) == 1:
                best = _best(study)
                if best is not None:
                    client.log_metric(self.parent_id, "best_value", best.value)
                    client.set_tag(self.parent_id, "best_trial", str(best.number))
                    for name, value in best.params.items():
                        client.set_tag(self.parent_id, f"best_params.{name}", str(value))
            if self._started:
                self.mlflow.end_run(status="FAILED" if failed else "FINISHED")
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        log.warning("spark_dist: MLflow logging stopped for this study: %r", exc)
        self.mlflow = None


class TrialRunLog:
    """One trial's child run (started in the trial's thread, where its Distributor logs into it)."""

    def __init__(self, runs: StudyRuns, trial):
        self.mlflow, self.trial = runs.mlflow, trial
        if self.mlflow is None:
            return
        try:
            self.mlflow.start_run(run_name=f"trial-{trial.number}", parent_run_id=runs.parent_id,
                                  experiment_id=runs.experiment_id, nested=True,
                                  tags={"optuna.trial_number": str(trial.number)})
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)

    def params(self) -> None:
        """The trial's parameters, as the objective suggested them."""
        self._log(lambda: self.mlflow.log_params(dict(self.trial.params)))

    def end(self, state: str, values=None, error: Optional[str] = None) -> None:
        """The trial's value(s), its state as a tag and the run's status; the run ended."""
        if self.mlflow is None:
            return

        def close():
            if values is not None:
                vs = values if isinstance(values, (list, tuple)) else [values]
                names = ["value"] if len(vs) == 1 else [f"value_{i}" for i in range(len(vs))]
                self.mlflow.log_metrics(dict(zip(names, map(float, vs))))
            tags = {"optuna.trial_state": state}
            if error:
                tags["error"] = error[:4000]
            self.mlflow.set_tags(tags)
            self.mlflow.end_run(status=_STATUS[state])
        self._log(close)

    def _log(self, call) -> None:
        if self.mlflow is None:
            return
        try:
            call()
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        log.warning("spark_dist: MLflow logging stopped for trial %d: %r", self.trial.number, exc)
        if self.mlflow is not None and self.mlflow.active_run() is not None:
            try:
                self.mlflow.end_run(status="FAILED")
            except Exception:  # noqa: BLE001
                pass
        self.mlflow = None


def _best(study):
    try:
        return study.best_trial
    except ValueError:  # no trial completed
        return None
