"""clear_cache while another thread's prepare_datasets is under way: what that call writes or hands out stays."""
import logging
import os
import threading

from spark_dist.data import clear_cache, make_loader, prepare_datasets
from spark_dist.data.prepare import pipeline as cache
from spark_dist.data.urls import local_path


def _pausing_after_write(monkeypatch, pause_on: int):
    """Make the ``pause_on``-th cache write (1-based) wait, once written, until the test lets it go: the window
    in which the cache exists on disk but the call has not returned it yet. Returns (written, go) events."""
    real, written, go, writes = cache._materialise, threading.Event(), threading.Event(), []

    def materialise(*args, **kwargs):
        result = real(*args, **kwargs)
        writes.append(result)
        if len(writes) == pause_on:
            written.set()
            assert go.wait(60), "the test never let the write go on"
        return result

    monkeypatch.setattr(cache, "_materialise", materialise)
    return written, go


def _ids(handle):
    return sorted(i for b in make_loader(handle, rank=0, world_size=1, batch_size=10) for i in b["id"].tolist())


def test_clear_cache_leaves_what_a_prepare_under_way_writes_and_hands_out(spark_local, monkeypatch, caplog):
    clear_cache()  # earlier tests' caches: the counts below are this test's alone
    written, go = _pausing_after_write(monkeypatch, pause_on=2)
    datasets = {"first": spark_local.range(70), "second": spark_local.range(80)}
    out, failed = {}, []

    def prepare():
        try:
            out.update(prepare_datasets(spark_local, datasets, num_ranks=1))
        except BaseException as exc:  # noqa: BLE001 -- asserted below, in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=prepare)
    worker.start()
    try:
        assert written.wait(120), failed  # "first" is handed out, "second" is on disk, not yet returned
        with caplog.at_level(logging.WARNING, logger="spark_dist.data.prepare.registry"):
            assert clear_cache() == 0
    finally:
        go.set()
        worker.join(120)
    assert not failed, failed
    assert "1 in use" in caplog.text and "1 being written" in caplog.text
    assert _ids(out["first"]) == list(range(70)) and _ids(out["second"]) == list(range(80))

    dirs = [local_path(h.cache_dir_url) for h in out.values()]
    assert clear_cache() == 2  # once the call has returned, a later clear deletes them
    assert not any(os.path.exists(d) for d in dirs) and not os.path.exists(os.path.dirname(dirs[0]))
