"""What the driver tells a user once a run ended: the summary lines it prints (how long, how many ranks, the last
report of rank 0, each rank's wait for data against its training time) and the history as a pandas DataFrame."""
from __future__ import annotations

from typing import Any, Dict, List

from ..config import RunConfig
from ..wire.protocol import REPORT_KEYS

INPUT_BOUND_SHARE = 0.3  # a rank that waited for data this share of its training time is told it is input-bound


def print_summary(config: RunConfig, attempt: int, seconds: float, history: List[Dict[str, Any]],
                  input_stats: List[Dict[str, Any]]) -> None:
    """The run's end, in ``[spark_dist]`` lines on stdout: its ranks, time and retries, rank 0's last report,
    then each rank's wait for data."""
    last = next((r for r in reversed(history) if r.get("rank") == 0), None)
    tail = "" if last is None else "; last report: " + " ".join(
        f"{k}={metric_text(v)}" for k, v in last.items() if k not in REPORT_KEYS)
    where = "local processes" if config.local_mode else "Spark barrier tasks"
    retried = f" after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else ""
    print(f"[spark_dist] run {config.run_id}: {config.num_processes} ranks ({config.backend}, {where}) "
          f"finished in {seconds:.2f}s{retried}{tail}", flush=True)
    for stats in sorted(input_stats, key=lambda r: r["rank"]):
        share = stats["input_wait_seconds"] / max(stats["train_seconds"], 1e-9)
        hint = ("  <- input-bound: raise batch_size or give the loader more cores"
                if share > INPUT_BOUND_SHARE else "")
        print(f"[spark_dist]   rank {stats['rank']}: waited {stats['input_wait_seconds']:.2f}s for data in "
              f"{stats['train_seconds']:.2f}s of training ({share:.0%}), {stats['batches']} batches{hint}",
              flush=True)


def history_frame(records: List[Dict[str, Any]]):
    """``records`` (reports or per-epoch history) as a pandas DataFrame; ``time`` as timestamps."""
    import pandas as pd

    frame = pd.DataFrame.from_records(list(records))
    if "time" in frame.columns:
        frame["time"] = pd.to_datetime(frame["time"], unit="s")
    return frame


def metric_text(value) -> str:
    """A reported metric as the driver prints it: a float to 4 significant digits, anything else as is."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
