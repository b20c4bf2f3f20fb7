"""spark_dist.driver.report_tail, and the first task's use of it under Spark Connect: the reports it hands back
are bounded however long the run, keep what the driver's state is built from, and say how many were dropped.
No JVM: the first task's coordinator is a stand-in that reports as the ranks would."""
import pytest

from spark_dist.wire.protocol import INPUT_STATS_KEY, LOG_KEY
from spark_dist.driver.report_tail import ReportTail
from spark_dist.task.sharded_checkpoints import CHECKPOINT_KEY


def metric(rank, step):
    # Rank 1's metrics have names the driver's own records use too: they are a user's, and dropped like any.
    names = {"event": "eval", "input_wait_seconds": 0.01} if rank == 1 else {}
    return {"rank": rank, "attempt": 0, "time": float(step), "step": step, **names}


def checkpoint(seq):
    return {"rank": 0, "attempt": 0, "time": 0.0, CHECKPOINT_KEY: {"path": f"/c/{seq}", "seq": seq, "metric": None,
                                                                  "score": None, "mode": "min", "removed": []}}


def test_the_latest_of_each_rank_and_every_checkpoint_are_kept_in_arrival_order():
    tail = ReportTail(per_rank=3)
    arrived = []
    for step in range(10):
        for rank in range(2):
            arrived.append(metric(rank, step))
        if step % 4 == 0:
            arrived.append(checkpoint(step))
    arrived.append({INPUT_STATS_KEY: True, "rank": 1, "time": 0.0, "input_wait_seconds": 0.5, "train_seconds": 9.0,
                    "batches": 10})
    for record in arrived:
        tail(record)
    notice, *records = tail.items()
    assert notice == {LOG_KEY: notice[LOG_KEY]}
    assert "14 earlier ctx.report records were dropped (7 of rank 0, 7 of rank 1)" in notice[LOG_KEY]
    assert records == [r for r in arrived if CHECKPOINT_KEY in r or INPUT_STATS_KEY in r or r.get("step", 0) >= 7]
    assert tail.dropped == {0: 7, 1: 7}


def test_nothing_dropped_means_no_notice():
    tail = ReportTail(per_rank=5)
    for step in range(5):
        tail(metric(0, step))
    assert tail.items() == tuple(metric(0, step) for step in range(5)) and tail.notice() is None
    with pytest.raises(ValueError, match="per_rank must be at least 1"):
        ReportTail(per_rank=0)


def test_the_first_task_hands_back_a_bounded_tail_of_the_reports(monkeypatch):
    from spark_dist.config import RunConfig
    from spark_dist.driver import coordinator, first_task, report_tail
    from spark_dist.wire.protocol import LaunchSpec

    monkeypatch.setattr(report_tail, "PER_RANK", 50)

    class Reporting:
        """The first task's coordinator, as far as the reports go: each rank reports every step."""

        lost_ranks = []

        def __init__(self, store, config, spec, backend, on_report, **_):
            self.on_report = on_report

        def watch(self, wait):
            for step in range(2000):
                for rank in range(2):
                    self.on_report(metric(rank, step))
                if step % 500 == 0:
                    self.on_report(checkpoint(step))

        def drain_reports(self, final=False):
            pass

        def drain_output(self, final=False):
            return 0

        def seen(self, *args):
            return "seen"

    monkeypatch.setattr(coordinator, "Coordinator", Reporting)
    config = RunConfig.build(num_processes=2, run_id="tail", spark_conf={})
    spec = LaunchSpec(run_id="tail", attempt=0, store_host="127.0.0.1", store_port=0, job_bytes=b"",
                      secret=b"s" * 32)
    *records, watched = first_task.host_and_watch(config, None, spec, lambda: ["rank records"])
    assert records == ["rank records"]
    reports = watched.reports
    assert len(reports) == 1 + 2 * 50 + 4  # the notice, each rank's latest, every checkpoint
    assert "3900 earlier ctx.report records were dropped" in reports[0][LOG_KEY]
    assert [r[CHECKPOINT_KEY]["seq"] for r in reports if CHECKPOINT_KEY in r] == [0, 500, 1000, 1500]
    assert reports[-1] == metric(1, 1999)
