"""A rank's ``ctx.report`` records on their way to the driver (``task/rank_process._Reporter``)."""
from spark_dist.task import rank_process
from spark_dist.wire.protocol import REPORTS, LaunchSpec
from spark_dist.wire.sealed_store import SealedStore, host_store
from spark_dist.wire.store_log import StoreLog


def test_a_ranks_reports_cost_one_round_trip_every_few_and_every_one_is_in_after_the_flush(monkeypatch):
    server, port = host_store("127.0.0.1", 10.0)
    spec = LaunchSpec(run_id="r", attempt=0, store_host="127.0.0.1", store_port=port, secret=b"s" * 32,
                      job_bytes=b"")
    reporter = rank_process._Reporter(spec, 0)
    round_trips = []
    reporter._connected()
    queue_len = reporter._store.queue_len
    monkeypatch.setattr(reporter._store, "queue_len", lambda name: round_trips.append(name) or queue_len(name))
    sent = 2 * rank_process.REPORT_CONFIRM_EVERY + 3
    for step in range(sent):
        reporter({"step": step})
    assert len(round_trips) == 2
    reporter.flush()
    assert len(round_trips) == 3
    reader = SealedStore(server, b"s" * 32, spec.prefix)
    assert [r["step"] for r in StoreLog(reader, REPORTS).take()] == list(range(sent))
