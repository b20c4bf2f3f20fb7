"""A hostile peer on a run's store, for tests: it knows the run id (the Spark UI shows it) and every key name of
``wire/protocol.py``, finds the store's port by scanning this process's new listening ports, and tries every
operation a TCPStore client has on every key, until stopped. Used by tests/spark/test_store_security_runs.py and
the fault campaign (tests/chaos)."""
import threading
import time
from datetime import timedelta

import psutil

from spark_dist.wire import protocol

RANKS = 2  # the slots whose keys it guesses


def key_names():
    fixed = [protocol.ABORT, protocol.ARRIVED, protocol.REPORTS, protocol.OUTPUT, protocol.FAILURES,
             protocol.PROGRESS, protocol.RUN_SUCCEEDED, protocol.RESIZE, protocol.STACKS_WANTED]
    per_slot = [f(i) for i in range(RANKS) for f in (protocol.task_key, protocol.assignment_key,
                                                     protocol.ended_key, protocol.stack_key, protocol.beat_key,
                                                     protocol.clock_key, protocol.stall_stack_key)]
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
