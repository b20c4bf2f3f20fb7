"""spark_dist.wire.abort_watch: a supervisor's watch on the run's abort, woken by a real store."""
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from spark_dist.wire.abort_watch import AbortWatch, release
from spark_dist.wire.protocol import ABORT, Abort
from spark_dist.wire.sealed_store import SealedStore, host_store, join_store

SECRET = b"s" * 32
REPO = Path(__file__).resolve().parents[2]


def _store_and_connect():
    server, port = host_store("127.0.0.1", 30)

    def connect():
        return SealedStore(join_store("127.0.0.1", port, 30), SECRET, "run")
    return server, SealedStore(server, SECRET, "run"), connect


def _until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_a_sealed_abort_wakes_the_watch_at_once():
    server, store, connect = _store_and_connect()
    watch = AbortWatch(connect, poll=10.0)  # a poll this long: only the store's wake can deliver it in time
    time.sleep(0.2)
    assert watch.value is None and watch.live
    store.put(ABORT, Abort.RANK_FAILED)
    assert _until(lambda: watch.value is not None, timeout=1.0)
    assert watch.value == Abort.RANK_FAILED and watch.live
    watch.join(2)


def test_a_forged_abort_stops_nothing_until_a_sealed_one_replaces_it():
    server, store, connect = _store_and_connect()
    watch = AbortWatch(connect, poll=0.05)
    time.sleep(0.2)
    server.set(store.key(ABORT), b"not sealed with the run's key")
    time.sleep(0.5)
    assert watch.value is None and watch.live  # woken, opened nothing: looks again
    store.put(ABORT, Abort.TIMEOUT)
    assert _until(lambda: watch.value == Abort.TIMEOUT)
    watch.join(2)


def test_release_ends_a_closed_watch_before_the_store_is_dropped():
    server, store, connect = _store_and_connect()
    watch = AbortWatch(connect, poll=0.05)
    time.sleep(0.2)
    watch.close()
    release(store)
    watch.join(2)
    assert not watch._thread.is_alive() and watch.value is None
    assert store.lookup(ABORT) == Abort.ENDED
    store.put(ABORT, Abort.RANK_FAILED)
    release(store)  # a sealed abort stays as it is
    assert store.lookup(ABORT) == Abort.RANK_FAILED


def test_a_watch_that_cannot_connect_says_so():
    def refused():
        raise RuntimeError("connection refused")
    watch = AbortWatch(refused, poll=0.05)
    watch.join(2)
    assert not watch.live and watch.value is None


def test_a_process_that_releases_its_store_and_exits_at_once_ends_cleanly(tmp_path):
    """Local mode: the driver's process hosts the store and its ranks' supervisors (and their watches), then exits.
    A watch thread still inside a store call as the interpreter finalizes is ended in the middle of torch's C++
    code, which aborts the process ("terminate called without an active exception"): release ends the watches
    of that store first."""
    script = tmp_path / "exit_after_release.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from spark_dist.wire.abort_watch import AbortWatch, release
        from spark_dist.wire.sealed_store import SealedStore, host_store, join_store
        server, port = host_store("127.0.0.1", 30)
        store = SealedStore(server, b"s" * 32, "run")
        watches = [AbortWatch(lambda: SealedStore(join_store("127.0.0.1", port, 30), b"s" * 32, "run"), 1.0)
                   for _ in range(2)]
        time.sleep(0.5)  # both wait on the key
        watches[1].close()  # its supervisor ended: a closed watch is released too
        release(store)
        sys.exit(0)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "terminate called" not in result.stderr
