"""A hostile peer on the run's store, during real runs: it knows the run id (the Spark UI shows it) and every key
name of ``wire/protocol.py``, finds the port by scanning, and tries every operation a TCPStore client has. The
runs end as they would without it, and nothing it reads holds a line a rank printed."""
import os
import time

import pytest

from spark_dist import Distributor, TrainingFailedError, get_context
from hostile_store import HostileClient

LINE = "confidential-line-7f3a"
RANKS = 2


def chatty(fail_rank):
    ctx = get_context()
    for step in range(12):
        print(f"{LINE} rank {ctx.rank} step {step}", flush=True)
        ctx.report(step=step)
        time.sleep(0.1)
    if ctx.rank == fail_rank:
        raise ValueError(f"rank {ctx.rank} gives up on purpose")
    return "finished"


@pytest.fixture
def hostile():
    started = []

    def start(run_id):
        client = HostileClient(run_id)
        client.start()
        started.append(client)
        return client

    yield start
    for client in started:
        client.stop.set()
        client.join(30)
        assert not client.is_alive()


def test_a_hostile_peer_changes_no_result_and_reads_no_line(spark_local, hostile):
    run_id = f"hostile-{os.getpid()}"
    client = hostile(run_id)
    d = Distributor(num_processes=RANKS, verbose=False, log_ranks="all", run_id=run_id)
    assert d.run(chatty, None) == "finished"
    assert sorted((r["rank"], r["step"]) for r in d.history if "step" in r) == [
        (rank, step) for rank in range(RANKS) for step in range(12)]
    client.stop.set()
    client.join(10)
    assert client.ports and client.operations > 100  # it found the store and kept at it during the run
    assert not [v for v in client.read if LINE.encode() in v]


def test_a_hostile_peer_hides_no_failure(spark_local, hostile):
    run_id = f"hostile-fail-{os.getpid()}"
    client = hostile(run_id)
    with pytest.raises(TrainingFailedError) as failed:
        Distributor(num_processes=RANKS, verbose=False, log_ranks="all", run_id=run_id).run(chatty, 1)
    assert failed.value.rank == 1 and "gives up on purpose" in str(failed.value)
    client.stop.set()
    client.join(10)
    assert client.ports and not [v for v in client.read if LINE.encode() in v]
