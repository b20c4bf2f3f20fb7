"""The driver's end-of-run lines and the history frame (spark_dist.driver.summary), from the records a run keeps;
no JVM. Real runs print them in tests/spark/test_launcher.py and tests/e2e/test_cli.py."""
import pytest

from spark_dist.config import RunConfig
from spark_dist.driver.summary import history_frame, print_summary, stragglers


def config(**fields):
    return RunConfig.build(spark_conf={}, num_processes=2, run_id="r1", **fields)


def test_the_summary_names_the_run_its_retries_rank_zeros_last_report_and_each_ranks_wait(capsys):
    history = [{"rank": 1, "attempt": 1, "time": 1.0, "loss": 9.0},
               {"rank": 0, "attempt": 1, "time": 2.0, "epoch": 3, "loss": 0.123456}]
    stats = [{"rank": 1, "input_wait_seconds": 4.0, "train_seconds": 10.0, "batches": 7},
             {"rank": 0, "input_wait_seconds": 0.5, "train_seconds": 10.0, "batches": 7}]
    print_summary(config(), 1, 12.345, history, stats)
    assert capsys.readouterr().out.splitlines() == [
        "[spark_dist] run r1: 2 ranks (ddp, Spark barrier tasks) finished in 12.35s after 1 retry; last report: "
        "epoch=3 loss=0.1235",
        "[spark_dist]   rank 0: waited 0.50s for data in 10.00s of training (5%), 7 batches",
        "[spark_dist]   rank 1: waited 4.00s for data in 10.00s of training (40%), 7 batches  <- input-bound: raise "
        "batch_size or give the loader more cores",
    ]
    print_summary(config(local_mode=True), 2, 1.0, [], [])
    assert capsys.readouterr().out == "[spark_dist] run r1: 2 ranks (ddp, local processes) finished in 1.00s " \
                                      "after 2 retries\n"


def test_the_history_frame_has_a_row_per_record_and_timestamps():
    pd = pytest.importorskip("pandas")
    frame = history_frame([{"rank": 0, "time": 0.0, "loss": 1.0}, {"rank": None, "time": 60.0, "event": "resize"}])
    assert list(frame["loss"].isna()) == [False, True] and frame["event"].tolist()[1] == "resize"
    assert frame["time"].tolist() == [pd.Timestamp(0, unit="s"), pd.Timestamp(60, unit="s")]


def steps_of(rank, wait, compute, host="h1", timed=50):
    return {"rank": rank, "host": host, "timed_steps": timed, "wait_p50": wait, "compute_p50": compute,
            "own_p50": wait + compute}


def test_a_rank_whose_own_step_is_over_a_quarter_above_the_ranks_median_is_named_with_where_its_time_went():
    even = [steps_of(r, 0.002, 0.020 + 0.001 * r) for r in range(4)]
    assert stragglers(even) == []
    slow_compute = even[:3] + [steps_of(3, 0.002, 0.040, host="h9")]
    assert stragglers(slow_compute) == [
        "rank 3 on h9 is a straggler: 42.0 ms of its own a step, 1.8x the ranks' median of 23.5 ms, most of it "
        "computing (40.0 ms a step, the ranks' median 21.5 ms): its host or device is slower or busier; its peers "
        "wait for it"]
    slow_data = [steps_of(0, 0.030, 0.020)] + even[1:]
    assert "rank 0 on h1 is a straggler" in stragglers(slow_data)[0] and "waiting for data" in stragglers(slow_data)[0]


def test_tiny_differences_and_ranks_with_few_timed_steps_name_nobody():
    assert stragglers([steps_of(0, 0, 0.0002), steps_of(1, 0, 0.0009)]) == []  # 4.5x, but under 2 ms apart
    assert stragglers([steps_of(0, 0, 0.02), steps_of(1, 0, 0.09, timed=3)]) == []
