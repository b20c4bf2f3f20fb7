"""A hostile peer on the run's store, during real runs: it knows the run id (the Spark UI shows it) and every key
name of ``wire/protocol.py``, finds the port by scanning, and tries every operation a TCPStore client has. The
runs end as they would without it, and nothing it reads holds a line a rank printed."""
import os
import threading
import time
from datetime import timedelta

import psutil
import pytest

from spark_dist import Distributor, TrainingFailedError, get_context
from spark_dist.wire import protocol

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


def key_names():
    fixed = [protocol.ABORT, protocol.ARRIVED, protocol.REPORTS, protocol.OUTPUT, protocol.FAILURES,
             protocol.PROGRESS, protocol.RUN_SUCCEEDED, protocol.RESIZE]
    per_slot = [f(i) for i in range(RANKS) for f in (protocol.task_key, protocol.assignment_key,
                                                     protocol.ended_key, protocol.stack_key, protocol.beat_key)]
    return fixed + per_slot


class HostileClient(threading.Thread):
    """Scans this process's new listening ports for the store, then tries get, set, add, queue_pop and
    compare_set on every key under every prefix it can guess, until stopped."""

    def __init__(self, run_id: str):
        super().__init__(daemon=True, name="hostile-client")
        self.run_id = run_id
        self.before = self._listening()
        self.stop = threading.Event()
        self.read, self.operations, self.ports = [], 0, set()

    @staticmethod
    def _listening():
        return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}

    def run(self):
        prefixes = [f"spark_dist/{self.run_id}/{a}" for a in range(2)] + [f"spark_dist/{self.run_id}", ""]
        keys = [f"{p}/{name}" if p else name for p in prefixes for name in key_names()]
        while not self.stop.is_set():
            for port in self._listening() - self.before:
                for key in keys:
                    if self.stop.is_set():
                        return
                    self._attack(port, key)
            time.sleep(0.05)

    def _attack(self, port, key):
        """Every operation on ``key``, on a connection of its own (the store drops a client whose ``add``
        meets a value that is no number)."""
        from torch.distributed import TCPStore

        try:
            store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=2))
        except Exception:  # noqa: BLE001 -- not a store, or gone
            return
        self.ports.add(port)
        for op in (lambda: store.get(key) if store.check([key]) else None,
                   lambda: store.queue_pop(key, False),
                   lambda: store.compare_set(key, b"", b"forged"),
                   lambda: store.set(key, b"\0" * 48),
                   lambda: store.add(key + "#n", 1),
                   lambda: store.add(key, 1)):
            self.operations += 1
            try:
                value = op()
            except Exception:  # noqa: BLE001 -- refused, absent, or not a number: the attack goes on
                continue
            if isinstance(value, bytes):
                self.read.append(value)


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
