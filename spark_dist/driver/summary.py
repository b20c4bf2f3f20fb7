"""What the driver tells a user once a run ended: the summary lines it prints (how long, how many ranks, the last
report of rank 0, each rank's wait for data against its training time) and the history as a pandas DataFrame."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List

from ..config import RunConfig
from ..wire.protocol import REPORT_KEYS

INPUT_BOUND_SHARE = 0.3  # a rank that waited for data this share of its training time is told it is input-bound
STRAGGLER_RATIO = 1.25  # a rank whose own median step is this much over the ranks' median is a straggler
STRAGGLER_FLOOR_S = 0.002  # ...and over it by this much at least
MIN_TIMED_STEPS = 5


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
    for stats in sorted((s for s in input_stats if "batches" in s), key=lambda r: r["rank"]):
        share = stats["input_wait_seconds"] / max(stats["train_seconds"], 1e-9)
        hint = ("  <- input-bound: raise batch_size or give the loader more cores"
                if share > INPUT_BOUND_SHARE else "")
        print(f"[spark_dist]   rank {stats['rank']}: waited {stats['input_wait_seconds']:.2f}s for data in "
              f"{stats['train_seconds']:.2f}s of training ({share:.0%}), {stats['batches']} batches{hint}",
              flush=True)
    for line in stragglers(input_stats):
        print(f"[spark_dist]   {line}", flush=True)


def stragglers(step_stats: List[Dict[str, Any]]) -> List[str]:
    """A line for each rank whose median step of its own (its wait for data and its compute, the time that
    was not spent waiting for its peers) is over :data:`STRAGGLER_RATIO` times the ranks' median: its host and
    where its time went, data or compute, whichever of its medians is further above the ranks'. Ranks with
    fewer than :data:`MIN_TIMED_STEPS` timed steps are not compared; nor is a difference under
    :data:`STRAGGLER_FLOOR_S`, noise on any machine."""
    timed = [s for s in step_stats if s.get("timed_steps", 0) >= MIN_TIMED_STEPS]
    if len(timed) < 2:
        return []
    own = statistics.median(s["own_p50"] for s in timed)
    wait = statistics.median(s["wait_p50"] for s in timed)
    compute = statistics.median(s["compute_p50"] for s in timed)
    lines = []
    for s in sorted(timed, key=lambda s: s["rank"]):
        if s["own_p50"] <= STRAGGLER_RATIO * own or s["own_p50"] - own < STRAGGLER_FLOOR_S:
            continue
        data_side = s["wait_p50"] - wait > s["compute_p50"] - compute
        where = (f"waiting for data ({_ms(s['wait_p50'])} a step, the ranks' median {_ms(wait)}): its input is "
                 "slower (raise workers= or give its executor more cores)" if data_side else
                 f"computing ({_ms(s['compute_p50'])} a step, the ranks' median {_ms(compute)}): its host or "
                 "device is slower or busier")
        lines.append(f"rank {s['rank']} on {s.get('host', '?')} is a straggler: {_ms(s['own_p50'])} of its own "
                     f"a step, {s['own_p50'] / max(own, 1e-9):.1f}x the ranks' median of {_ms(own)}, most of it "
                     f"{where}; its peers wait for it")
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


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
