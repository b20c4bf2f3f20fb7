"""What a :class:`~spark_dist.driver.distributor.Distributor` keeps and shows of its last run, as it happens and
once it ended: the reports, progress and stalls relayed to the console, MLflow and the history; the summary,
the run's time split (:meth:`RunView.goodput`) and its best checkpoint."""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional

from . import elastic, goodput, summary
from ..config import RunConfig
from ..task.sharded_checkpoints import CHECKPOINT_KEY
from ..wire.protocol import INPUT_STATS_KEY, LOG_KEY, REPORT_KEYS

log = logging.getLogger("spark_dist")


class RunView:
    """The part of a Distributor that records and shows its run (a mixin: the Distributor sets the state)."""

    @property
    def best_checkpoint(self) -> Optional[str]:
        """The directory of the last run's best sharded checkpoint (by the ``metric`` its saves named, else the
        latest), as rank 0's host sees it; ``None`` when it saved none, or when its checkpoints went with the
        run (the default directory of a run whose ``run_id`` spark_dist drew is removed once it succeeded: give
        ``checkpoint_dir=`` or ``run_id=`` to keep them). Read it with
        ``spark_dist.task.sharded_checkpoints.load_full(path)`` or a ``load_checkpoint`` of a resumed run. The
        ranking is retention's (a NaN or infinite score ranks last), so the one named is one retention kept."""
        from ..task.retention import best_of

        if not self.checkpoints or not self._checkpoints_kept:
            return None
        best = best_of(self.checkpoints, 1, self.checkpoints[-1]["mode"], score=lambda c: c["score"])
        return (best[0] if best else self.checkpoints[-1])["path"]

    def _on_report(self, record: Dict[str, Any]) -> None:
        if CHECKPOINT_KEY in record:  # rank 0 committed a sharded checkpoint (and removed some)
            done = record[CHECKPOINT_KEY]
            if "kept" in done:  # every checkpoint rank 0 kept, an earlier run's under this run_id included
                self.checkpoints = [{**c, "mode": done["mode"]} for c in done["kept"]]
            gone = set(done["removed"]) | {done["path"]}
            self.checkpoints = [c for c in self.checkpoints if c["path"] not in gone] + [
                {k: done[k] for k in ("path", "seq", "metric", "score", "mode")}]
            return
        if LOG_KEY in record:  # log_to_driver: shown whatever the verbosity, kept nowhere
            print(record[LOG_KEY], flush=True)
            return
        if INPUT_STATS_KEY in record:  # the rank's input statistics, shown in the summary
            self.input_stats.append({k: v for k, v in record.items() if k != INPUT_STATS_KEY})
            return
        self.history.append(record)
        self._tracker.report(record)
        if self.verbose:
            metrics = {k: v for k, v in record.items() if k not in REPORT_KEYS}
            if record.get("rank") == 0:
                self._bar.show_metrics(metrics)
            shown = " ".join(f"{k}={summary.metric_text(v)}" for k, v in metrics.items())
            print(f"[spark_dist rank {record.get('rank')}] {shown}", flush=True)

    def _on_progress(self, progress) -> None:
        """Where rank 0's loader is (epoch, step, steps, its steps/s): the bar only, not history."""
        if self.verbose:
            self._bar.advance(*progress)

    def _on_stall(self, diagnosis, attempt: int) -> None:
        """A stall's diagnosis: printed (logged as a warning when not verbose), kept as an MLflow artifact."""
        self.stalls.append(diagnosis)
        self._bar.close()
        if self.verbose:
            print("\n".join(f"[spark_dist] {line}" for line in diagnosis.lines()), flush=True)
        else:
            log.warning("spark_dist: run %s: %s", self.last_run_id, "\n".join(diagnosis.lines()))
        self._tracker.stall(diagnosis, attempt)

    def _account(self, rows) -> None:
        """The run's time split (:mod:`spark_dist.driver.goodput`): kept for :meth:`goodput`, sent to MLflow."""
        self.goodput_rows = rows
        if rows:
            total = goodput.totals(rows)
            self._tracker.goodput(total, goodput.recovery_seconds(self._attempt_times))

    def history_frame(self):
        """The last run's ``ctx.report`` records as a pandas DataFrame, one row per report in the order they
        arrived: ``rank``, ``attempt``, ``time`` (a timestamp) and one column per metric, ready to plot
        (``d.history_frame().query("rank == 0").plot(x="epoch", y="loss")``); with the driver's rows (no
        ``rank``) of each resize and preemption: ``event``, ``world_size``, ``reason``."""
        return summary.history_frame(self.history)

    def goodput(self):
        """Where the last run's time went, as a pandas DataFrame with a row per attempt: ``attempt``,
        ``world_size``, ``ending``, the seconds of each part (``setup``, ``recovery``, ``slots``, ``launch``,
        ``process_group``, ``training``, ``data_wait``, ``checkpoint_stall``, ``lost_work``, ``teardown``: see
        :mod:`spark_dist.driver.goodput`), ``wall`` (their sum: the run's wall time) and ``goodput`` (training
        over wall). Plot it stacked: ``d.goodput().set_index("attempt")[list(PARTS)].plot.barh(stacked=True)``.
        Kept for a run that failed too."""
        import pandas as pd

        return pd.DataFrame.from_records(self.goodput_rows).drop(columns=["first_step"], errors="ignore")

    def _summary(self, config: RunConfig, attempt: int, seconds: float) -> None:
        self._bar.close()
        if self.verbose:
            summary.print_summary(config, attempt, seconds, self.history, self.input_stats)
            if self.goodput_rows:
                print(f"[spark_dist]   {goodput.line(self.goodput_rows)}", flush=True)


def times_of(running, attempt: int, size: int, queued_at: float, outcome) -> goodput.AttemptTimes:
    """What the driver noted of an attempt that ended (``outcome`` None: interrupted), for the run's time
    split."""
    if outcome is None:
        ending = "interrupted"
    elif outcome.failures is None:
        ending = "succeeded"
    elif outcome.timed_out:
        ending = "timed out"
    else:
        ending = "resized" if elastic.stop_of(outcome.failures) is not None else "failed"
    seen = getattr(running, "seen", None)  # None: the attempt never got as far as its evidence
    return goodput.AttemptTimes(attempt, size, ending, queued_at, getattr(running, "submitted_at", None),
                                time.time(), clocks=dict(seen.clocks) if seen is not None else {},
                                failed_at=seen.failed_at if seen is not None and ending != "succeeded" else None)
