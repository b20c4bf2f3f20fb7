"""The coordinator's watch over the store: a rendezvous in O(n) requests, and counters nobody signed treated as
hints that a stranger cannot turn into work, memory or an early end."""
import os
import sys
import time

import pytest

from spark_dist import Distributor, get_context
from spark_dist.backends.base import Backend
from spark_dist.config import RunConfig
from spark_dist.driver.coordinator import Coordinator
from spark_dist.wire.protocol import ARRIVED, FAILURES, LaunchSpec, beat_key, ended_key
from spark_dist.wire.ranks import RankInfo
from spark_dist.wire.sealed_store import SealedStore, host_store, join_store

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from bench_rendezvous import Counting, simulate  # noqa: E402


def forge_every_counter_then_report():
    """Rank 0 turns stranger: it reaches the store (the torchrun variables name it) without the run's secret."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    ctx = get_context()
    if ctx.rank == 0:
        store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timedelta(seconds=10))
        prefix = f"spark_dist/{ctx.run_id}/{ctx.attempt}"
        for name in ("report_seq", "failure_seq", "out_seq/0", "out_seq/1", "beat/0", "beat/1", "arrived"):
            store.add(f"{prefix}/{name}", 10**12)
        for queue in ("reports", "output", "failures"):
            store.queue_push(f"{prefix}/{queue}", b"\0" * 64)
        store.set(f"{prefix}/ended/1", b"\0" * 64)
        store.set(f"{prefix}/progress", b"\0" * 64)
    time.sleep(1.5)  # the driver's watch polls meanwhile
    ctx.report(after_the_forgery=ctx.rank)
    print(f"rank {ctx.rank} still heard")
    return "trained"


def test_a_run_whose_counters_were_forged_with_huge_values_ends_normally(spark_local, capsys):
    d = Distributor(num_processes=2, verbose=False, log_ranks="all", timeout=120)
    assert d.run(forge_every_counter_then_report) == "trained"
    assert sorted(r["after_the_forgery"] for r in d.history) == [0, 1]
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 still heard" in out and "[rank 1] rank 1 still heard" in out
