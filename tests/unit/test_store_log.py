"""The store log: what ranks and supervisors append, the coordinator takes once, in order, and the store forgets."""
import pickle

import pytest

from spark_dist.wire.sealed_store import SealedStore, host_store, join_store
from spark_dist.wire.store_log import TAKE_LIMIT, StoreLog


@pytest.fixture
def stores():
    server, port = host_store("127.0.0.1", 10.0)
    reader = SealedStore(server, b"s" * 32, "run")
    writer = SealedStore(join_store("127.0.0.1", port, 10.0), b"s" * 32, "run")
    yield reader, writer


def test_records_are_taken_in_order_once_and_then_gone_from_the_store(stores):
    reader, writer = stores
    rank0, rank1 = StoreLog(writer, "reports", "rank0"), StoreLog(writer, "reports", "rank1")
    assert [rank0.append({"step": 1}), rank1.append({"step": 1}), rank0.append({"step": 2})] == [1, 2, 3]
    log = StoreLog(reader, "reports")
    assert log.take() == [{"step": 1}, {"step": 1}, {"step": 2}]
    assert log.take() == [] and reader.queue_len("reports") == 0 and reader.raw.num_keys() == 0


def test_forged_and_replayed_records_are_dropped_and_cost_one_pop_each(stores):
    reader, writer = stores
    stranger = writer.raw  # reaches the port, lacks the secret
    log, mine = StoreLog(reader, "reports"), StoreLog(writer, "reports", "rank0")
    mine.append("first")
    stranger.queue_push(writer.key("reports"), b"\0" * 32 + pickle.dumps(("rank0", 10**9, "forged")))
    assert log.take() == ["first"]
    replay = reader.raw  # a signed record seen on the wire and pushed again
    mine.append("second")
    blob = replay.queue_pop(reader.key("reports"), False)
    replay.queue_push(reader.key("reports"), blob)
    replay.queue_push(reader.key("reports"), blob)
    assert log.take() == ["second"] and log.dropped == 2


def test_a_replayed_record_is_dropped_and_the_take_goes_on_past_it(stores):
    reader, writer = stores
    log, mine = StoreLog(reader, "reports"), StoreLog(writer, "reports", "rank0")
    mine.append("first")
    blob = reader.raw.queue_pop(reader.key("reports"), False)
    reader.raw.queue_push(reader.key("reports"), blob)
    assert log.take() == ["first"]
    reader.raw.queue_push(reader.key("reports"), blob)  # seen on the wire, pushed again
    mine.append("second")
    assert log.take() == ["second"] and log.dropped == 1


def test_a_sealed_value_that_is_no_record_is_dropped_not_taken(stores):
    # Sealed with the run's secret, but not (writer, number, value): a writer of another version, or a bug.
    reader, writer = stores
    for odd in ["not a record", ("rank0", 1), (0, 1, "x"), ("rank0", "1", "x")]:
        writer.push("reports", odd)
    StoreLog(writer, "reports", "rank0").append("real")
    log = StoreLog(reader, "reports")
    assert log.take() == ["real"] and log.dropped == 4


def test_one_take_pops_a_bounded_number_whatever_was_pushed(stores):
    reader, writer = stores
    for _ in range(TAKE_LIMIT + 5):
        writer.raw.queue_push(writer.key("output"), b"junk")
    assert writer.queue_len("output") == TAKE_LIMIT + 5  # a round trip: every push is in
    log = StoreLog(reader, "output")
    assert log.take() == [] and log.dropped == TAKE_LIMIT
    assert reader.queue_len("output") == 5


def test_a_writer_sees_how_many_records_wait_and_whether_it_has_room(stores):
    reader, writer = stores
    log = StoreLog(writer, "output", "rank0")
    for _ in range(3):
        log.append("x")
    assert log.has_room(4) and not log.has_room(3)
    StoreLog(reader, "output").take(limit=1)
    assert log.has_room(3)


def test_a_writer_may_push_without_a_round_trip_and_confirm_them_all_at_once(stores):
    # ctx.report's records: a round trip every few records, the rest confirmed once at the rank's end.
    reader, writer = stores
    mine = StoreLog(writer, "reports", "rank0")
    assert [mine.append(step, confirm=False) for step in range(3)] == [None] * 3
    assert mine.confirm() == 3  # the same connection: every push before it is in the store
    assert StoreLog(reader, "reports").take() == [0, 1, 2]


def test_a_take_pops_only_what_the_queue_holds(stores):
    # An empty queue's pop raises inside torch: a take asks the length once and never pops an empty queue.
    driver, rank = stores
    pops = []
    pop = driver.pop
    driver.pop = lambda name: pops.append(name) or pop(name)
    log = StoreLog(driver, "reports")
    assert log.take() == [] and pops == []
    writer = StoreLog(rank, "reports", writer="rank0")
    for i in range(3):
        writer.append(i)
    assert log.take() == [0, 1, 2] and len(pops) == 3
