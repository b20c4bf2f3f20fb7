"""MLflow on the driver: a run's parameters, reported metrics (with their steps), the input-wait summary
and, for the estimator, the model, when MLflow is in use here.

In use means: ``mlflow`` imports, and a tracking URI is set (``MLFLOW_TRACKING_URI`` or
``mlflow.set_tracking_uri``) or a run is active on the driver. Without that, or without mlflow, nothing
happens. Only the driver talks to MLflow: executors get no credentials and no tracking settings. A run
already active is logged into (as ``mlflow.autolog`` users expect); otherwise one is started, named after
the spark_dist run, and ended with it. Logging never fails a training: an MLflow error is one warning.
"""
from __future__ import annotations

import logging
import numbers
import os
import sys
from typing import Any, Dict, Optional

from ..wire.protocol import REPORT_KEYS

log = logging.getLogger("spark_dist")

_STEP_KEYS = ("step", "global_step", "epoch")  # what a report's own step is called, in order of preference


def _mlflow():
    # Importing mlflow is slow (see BENCHMARKS.md, Spark ML), so it is imported only where it can be in use: the
    # user imported it (set_tracking_uri and an active run both need that), or MLFLOW_TRACKING_URI is set.
    if "mlflow" not in sys.modules and not os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    try:
        import mlflow
    except ImportError:
        return None
    try:
        from mlflow.tracking._tracking_service import utils
        uri_set = utils.is_tracking_uri_set()
    except (ImportError, AttributeError):
        uri_set = bool(os.environ.get("MLFLOW_TRACKING_URI"))
    return mlflow if uri_set or mlflow.active_run() is not None else None


class Tracker:
    """One spark_dist run's MLflow logging (a no-op when MLflow is not in use)."""

    def __init__(self, run_id: str, params: Dict[str, Any]):
        self.mlflow = _mlflow()
        self._started = False
        self._count: Dict[str, int] = {}
        if self.mlflow is None:
            return
        try:
            if self.mlflow.active_run() is None:
                self.mlflow.start_run(run_name=run_id)
                self._started = True
            self.mlflow.log_params({k: v for k, v in params.items() if v is not None})
        except Exception as exc:  # noqa: BLE001 -- tracking is a side channel
            self._give_up(exc)

    @classmethod
    def inactive(cls) -> "Tracker":
        """A tracker that logs nothing (before any run)."""
        tracker = cls.__new__(cls)
        tracker.mlflow, tracker._started, tracker._count = None, False, {}
        return tracker

    @property
    def active(self) -> bool:
        return self.mlflow is not None

    def report(self, record: Dict[str, Any]) -> None:
        """Rank 0's numeric metrics, at the report's own step (``step``, ``global_step`` or ``epoch``),
        else numbered in arrival order."""
        if self.mlflow is None or record.get("rank") != 0:
            return
        metrics = {k: float(v) for k, v in record.items() if k not in REPORT_KEYS
                   and isinstance(v, numbers.Real) and not isinstance(v, bool)}
        step_key = next((k for k in _STEP_KEYS if k in metrics), None)
        for key, value in metrics.items():
            if key == step_key:
                continue
            step = int(metrics[step_key]) if step_key else self._count.get(key, 0)
            self._count[key] = step + 1
            self._log(lambda: self.mlflow.log_metric(key, value, step=step))

    def world_size(self, attempt: int, size: int) -> None:
        """An elastic run's number of ranks, at the attempt it started with (the ``world_size`` metric)."""
        self._log(lambda: self.mlflow.log_metric("world_size", size, step=attempt))

    def input_stats(self, stats) -> None:
        """Each rank's time waiting for data, against its training time, and its median step."""
        for s in stats:
            self._log(lambda s=s: self.mlflow.log_metrics({
                f"{name}_rank{s['rank']}": s[name]
                for name in ("input_wait_seconds", "train_seconds", "step_p50", "own_p50") if name in s}))

    def goodput(self, total: Dict[str, float], recovery_seconds: float) -> None:
        """The run's goodput (training over wall time), the shares of data wait and checkpoint stalls, and the
        seconds its failures cost (spark_dist.driver.goodput)."""
        wall = total["wall"] or 1.0
        self._log(lambda: self.mlflow.log_metrics({
            "goodput": total["goodput"], "data_wait_fraction": round(total["data_wait"] / wall, 4),
            "checkpoint_stall_fraction": round(total["checkpoint_stall"] / wall, 4),
            "recovery_seconds": recovery_seconds}))

    def stall(self, diagnosis, attempt: int) -> None:
        """A stall's diagnosis (every rank's stack) as the artifact ``stalls/attempt<a>-<n>.txt``, with each
        rank's NCCL Flight Recorder dump beside it (``nccl_trace_rank<r>.pkl``, torch's ``fr_trace`` reads it)."""
        name = f"stalls/attempt{attempt}-{diagnosis.number}"
        self._log(lambda: self.mlflow.log_text(diagnosis.text(), f"{name}.txt"))
        for r in diagnosis.ranks:
            if r.nccl_trace:
                self._log(lambda r=r: self._log_bytes(r.nccl_trace, name, f"nccl_trace_rank{r.rank}.pkl"))

    def _log_bytes(self, data: bytes, directory: str, name: str) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
            self.mlflow.log_artifact(os.path.join(tmp, name), directory)

    def model(self, model) -> None:
        """A fitted TorchModel, saved as MLflow artifacts under ``model/`` (``TorchModel.load`` reads them)."""
        if self.mlflow is None:
            return
        import tempfile

        def log_model():
            with tempfile.TemporaryDirectory(prefix="spark_dist-mlflow-") as tmp:
                path = os.path.join(tmp, "model")
                model.write().save(path)
                self.mlflow.log_artifacts(path, artifact_path="model")
        self._log(log_model)

    def end(self, failed: bool = False) -> None:
        if self.mlflow is not None and self._started:
            self._log(lambda: self.mlflow.end_run(status="FAILED" if failed else "FINISHED"))
            self._started = False

    def _log(self, call) -> None:
        if self.mlflow is None:
            return
        try:
            call()
        except Exception as exc:  # noqa: BLE001 -- tracking is a side channel
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        log.warning("spark_dist: MLflow logging stopped for this run: %r", exc)
        self.mlflow = None


def run_params(args: Dict[str, Any]) -> Dict[str, Optional[Any]]:
    """The Distributor's arguments as MLflow params."""
    return {k: args.get(k) for k in ("num_processes", "min_processes", "backend", "local_mode", "use_gpu",
                                     "max_retries", "timeout", "run_id")}
