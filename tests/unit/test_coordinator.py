"""The coordinator's rendezvous on a real store without Spark: requests per task, forged counters and beats."""
import os
import sys

import pytest

from spark_dist.backends.base import Backend
from spark_dist.config import RunConfig
from spark_dist.driver.coordinator import Coordinator
from spark_dist.wire.protocol import ARRIVED, FAILURES, LaunchSpec, beat_key, ended_key
from spark_dist.wire.ranks import RankInfo
from spark_dist.wire.sealed_store import SealedStore, host_store, join_store

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from bench_rendezvous import Counting, simulate  # noqa: E402


def test_a_rendezvous_of_many_tasks_costs_a_few_requests_per_task():
    n = 32
    result = simulate(n)
    assert result["ranks"] == list(range(n))
    # Each task: its TaskInfo, the arrival counter, a check, one wait, one read; a task that comes last may find
    # its assignment already written at its check, and skips the wait. The driver: a counter read a poll, one
    # check and one read of all tasks, one write of all assignments, and a beat read a rank.
    assert 4 * n <= result["task_requests"] <= 5 * n
    assert result["driver_requests"] <= n + 100


def first_task_coordinator(server, port: int, run_id: str) -> Coordinator:
    """A coordinator of a 2-rank run as the first task runs it (no Spark job to wait for), on ``server``."""
    config = RunConfig.build(num_processes=2, run_id=run_id, spark_conf={})
    spec = LaunchSpec(run_id=run_id, attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=b"s" * 32)
    return Coordinator(SealedStore(server, spec.secret, spec.prefix), config, spec, Backend(), job_ended=None,
                       cancel=lambda: None, on_report=lambda r: None, deadline=None, host="127.0.0.1")


@pytest.fixture
def coordinator():
    server, port = host_store("127.0.0.1", 10.0)
    counted = Counting(server)
    watch = first_task_coordinator(counted, port, "forged")
    ours = watch.store
    stranger = join_store("127.0.0.1", port, 10.0)  # reaches the port, lacks the secret
    yield watch, counted, stranger, ours


def test_forged_counters_cost_a_request_not_a_loop(coordinator):
    watch, counted, stranger, ours = coordinator
    stranger.add(ours.key(ARRIVED), 10**9)
    before = counted.requests
    assert watch._arrived_tasks(2) is None  # the count says "all came": one check says otherwise
    assert counted.requests - before == 2
    watch.ranks = [RankInfo(r, r, 2, 2, 0, 1, "127.0.0.1") for r in range(2)]
    for rank in range(2):  # what once meant "ended" (a beat of 2**40), and an unsigned "ended" value
        stranger.add(ours.key(beat_key(rank)), 1 << 40)
        stranger.set(ours.key(ended_key(rank)), b"\0" * 40)
    assert not watch.all_ranks_ended()  # under Spark Connect this would have ended the watch early
    for _ in range(3000):
        stranger.queue_push(ours.key(FAILURES), b"\0" * 64)
    before = counted.requests
    assert watch.seen().failures == ()
    assert counted.requests - before < 3000 + 20  # one pop a forged record, as any forged value costs


def test_forged_or_replayed_beats_do_not_keep_a_silent_host_alive(coordinator):
    watch, counted, stranger, ours = coordinator
    watch.ranks = [RankInfo(r, r, 2, 2, 0, 1, "127.0.0.1") for r in range(2)]
    for rank in range(2):
        ours.put(beat_key(rank), (1, 0))  # each supervisor's first beat, no step yet
    replayed = {rank: stranger.get(ours.key(beat_key(rank))) for rank in range(2)}
    now = 1000.0
    assert not watch._silent_hosts(now)
    for _ in range(30):  # the supervisors went silent; a stranger beats for them every half second
        now += 0.5
        for rank in range(2):
            stranger.set(ours.key(beat_key(rank)), replayed[rank])  # a beat seen on the wire, sent again
        if watch._silent_hosts(now):
            break
    assert watch.lost_ranks and now - 1000.0 <= watch.config.host_lost_timeout + 1.0


def test_the_first_tasks_store_closes_as_soon_as_its_coordinator_is_dropped():
    # Under Spark Connect the first task hosts the store; a run started right after on the same fixed
    # spark.dist.storePort needs that port free once the task is done, not once the cyclic GC next runs.
    import gc
    import weakref

    from spark_dist.wire.sealed_store import bind_listener

    server, port = host_store("127.0.0.1", 10.0)
    watch = first_task_coordinator(server, port, "port")
    gone = weakref.ref(watch)
    gc.disable()
    try:
        del watch, server
        assert gone() is None  # freed by its reference count: nothing of it refers back to it
        bind_listener("127.0.0.1", port).close()  # the port is free at once
    finally:
        gc.enable()


def test_an_attempt_whose_ranks_all_ended_before_the_watch_saw_the_abort_failed_at_its_first_failure():
    # A rank dies and its peer raises at once: the job ends before the watch loop looks at the abort. The time
    # split still ends the attempt's work at the first failure, so the next attempt's recovery is not lost.
    from spark_dist.errors import RankFailure
    from spark_dist.wire.store_log import StoreLog

    server, port = host_store("127.0.0.1", 10.0)
    watch = first_task_coordinator(server, port, "ended-first")
    log = StoreLog(watch.store, FAILURES, writer="supervisor1")
    log.append(RankFailure(1, "127.0.0.1", "exit", "exited with code 3", exit_code=3, time=100.0))
    log.append(RankFailure(0, "127.0.0.1", "exception", "gloo: connection closed", time=100.2))
    watch.ranks = [RankInfo(r, r, 2, 2, 0, 1, "127.0.0.1") for r in range(2)]
    assert watch.failed_at is None
    assert watch.seen().failed_at == 100.0
