"""bench/bench_driver_scale.py on a few ranks for a few seconds (no JVM): the driver in its own process sees every
report the simulated ranks sent and every byte they printed, and the figures it measures are sane."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from bench_driver_scale import FLOORS, linear_checks, simulate  # noqa: E402

import pyspark  # noqa: E402
import pytest  # noqa: E402

RANKS, SECONDS = 8, 3.0
# No Spark and no torch in it: the 3.5 line's suite runs it.
pytestmark = pytest.mark.skipif(not pyspark.__version__.startswith("3.5"), reason="run on the 3.5 line's suite")


def test_a_short_run_of_a_few_ranks_delivers_everything_and_measures_the_driver():
    row = simulate(RANKS, SECONDS, threads=4)
    assert row["ranks"] == RANKS and row["ranks_assigned"] == RANKS
    assert row["abort"] is None and row["abort_seen_by_ranks"] is None and row["lost_ranks"] == []
    # One report a rank a second, each received once; every printed byte arrived (the last ones flushed).
    assert row["reports_sent"] >= RANKS * (SECONDS - 1)
    assert row["reports_received"] == row["reports_sent"] and row["reports_dropped"] == 0
    assert row["output_bytes_sent"] >= RANKS * 1024 * (SECONDS - 1)
    assert row["output_bytes_received"] == row["output_bytes_sent"]
    assert row["progress_updates"] >= 1
    # The figures: measured over the window, and plausible for a driver watching 8 ranks.
    assert SECONDS <= row["seconds"] < SECONDS + 1
    assert 0 < row["driver_cpu_fraction"] < 1.0
    assert abs(row["driver_watch_thread_fraction"] + row["driver_other_threads_fraction"]
               - row["driver_cpu_fraction"]) < 0.05
    assert row["rss_end_mib"] > 0 and abs(row["rss_growth_mib"]) < 64
    assert 0 < row["report_latency_p50_s"] <= row["report_latency_p99_s"] <= row["report_latency_max_s"] < 2.0
    # Every supervisor learns of the abort from its watch, waiting in the store: none looks at the key itself.
    assert row["supervisor_polls_per_rank_s"] == 0 and row["abort_watches_waiting"] == RANKS


def test_the_linear_check_flags_a_figure_that_grows_faster_than_the_ranks():
    rows = [{"ranks": 64, **{f: 1.0 for f in FLOORS}}, {"ranks": 256, **{f: 2.0 for f in FLOORS}}]
    rows[1]["rss_growth_mib"] = 64.0  # 64x for 4x the ranks
    checks = linear_checks(rows)
    assert not checks["rss_growth_mib"]["at_most_linear"]
    assert all(checks[f]["at_most_linear"] for f in FLOORS if f != "rss_growth_mib")
