"""A supervisor whose beats no longer reach the driver's store stops its rank (spark_dist/task/fence.py)."""
import threading
import time

from spark_dist.task.fence import Fence


def _fence(host_lost_timeout):
    stopped = threading.Event()
    return Fence(host_lost_timeout, stopped.set, "rank 3's supervisor"), stopped


def test_a_rank_whose_beats_stopped_reaching_the_store_is_stopped_after_the_lost_timeout(capsys):
    f, stopped = _fence(0.5)
    f.start()
    started = time.monotonic()
    assert stopped.wait(5)
    assert 1.0 <= time.monotonic() - started < 2.5  # twice hostLostTimeout, then within a look
    assert f.fenced
    assert "rank 3's supervisor could not reach the driver's store" in capsys.readouterr().err


def test_beats_that_keep_reaching_the_store_never_stop_the_rank():
    f, stopped = _fence(0.5)
    f.start()
    deadline = time.monotonic() + 2.5  # over twice the bound of 1 s
    while time.monotonic() < deadline:
        f.reached()
        time.sleep(0.1)
    f.ended.set()
    f.join(2)
    assert not stopped.is_set() and not f.fenced


def test_local_mode_fences_nothing():
    f, stopped = _fence(0.0)  # the ranks are the driver's own processes
    f.start()
    f.join(1)
    assert not f.is_alive() and not stopped.is_set()
