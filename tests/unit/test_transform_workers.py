"""spark_dist.data.read.transform_workers: a user transform over batches in worker processes. Order, the
in-flight bound, errors, seeding (same tensors with 0 or 2 workers), picklability, process lifetime, and starting
workers in a rank that runs a gloo process group. No JVM.

Transforms are defined inside the tests (as in a training function), so cloudpickle sends them by value.
"""
import gc
import io
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from spark_dist.data.handle import DatasetError
from spark_dist.data.read import transform_workers
from spark_dist.data.read.transform_workers import (TransformError, TransformPickleError, TransformWorkers,
                                                    batch_seed, transformed)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generic_fn():
    """A transform that sleeps as the batch asks, fails or returns a list when it says so, and draws from
    every generator that gets seeded."""
    def generic(batch):
        time.sleep(float(batch.get("delay", 0.0)))
        if batch.get("log"):  # which batches finished, in the order they did
            with open(batch["log"], "a") as f:
                f.write(f"{batch['i']}\n")
        if batch.get("fail"):
            raise ValueError(f"bad pixel in {int(batch['i'])}")
        if batch.get("as_list"):
            return [batch["i"]]
        return {"i": torch.as_tensor(batch["i"]), "torch": torch.rand(3), "numpy": torch.from_numpy(np.random.rand(2)),
                "random": torch.tensor([random.random()]), "seed": torch.tensor(batch_seed())}
    return generic


@pytest.fixture(scope="module")
def pool():
    """Two workers shared by the tests of the generic transform (workers take seconds to start)."""
    with TransformWorkers(_generic_fn(), workers=2, dataset="generic", seed=7) as p:
        yield p


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def children():
    return {c.pid for c in psutil.Process().children(recursive=True)}


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_order_kept_with_uneven_delays(pool, tmp_path):
    list(pool.map([{"i": 0}, {"i": 1}], epoch=0))  # both workers are up
    log = str(tmp_path / "finished")
    delays = [0.4, 0.0, 0.05, 0.3, 0.0, 0.0, 0.2, 0.0, 0.1, 0.0, 0.0, 0.25]
    waited = pool.wait_seconds
    out = list(pool.map([{"i": i, "delay": d, "log": log} for i, d in enumerate(delays)], epoch=0))
    assert [int(b["i"]) for b in out] == list(range(len(delays)))
    # The workers did finish them out of order (batch 0 sleeps longest): the order is the stage's doing.
    finished = [int(x) for x in open(log).read().split()]
    assert sorted(finished) == list(range(len(delays))) and finished != sorted(finished)
    assert pool.wait_seconds - waited >= 0.3  # the consumer waited for batch 0, and that is counted


def test_batches_in_flight_never_exceed_the_bound(tmp_path):
    log = str(tmp_path / "started")

    def fn(batch):
        with open(log, "a") as f:  # one short append per batch: lines from both workers stay whole
            f.write(f"{batch['i']}\n")
        time.sleep(0.01)
        return {"i": torch.tensor(batch["i"])}

    taken = [0]

    def source():
        for i in range(24):
            taken[0] += 1
            yield {"i": i}

    most_ahead = 0
    with TransformWorkers(fn, workers=2, in_flight=3, dataset="bounded") as workers:
        for n, out in enumerate(workers.map(source(), epoch=0)):
            assert int(out["i"]) == n
            # Taken from the input and not yet yielded, this one included: at most in_flight.
            assert taken[0] - n <= 3
            assert max(int(x) for x in open(log).read().split()) <= n + 2
            most_ahead = max(most_ahead, taken[0] - n)
            time.sleep(0.05)  # a slow consumer: without the bound the workers would run far ahead
    assert most_ahead == 3


def test_transform_error_names_dataset_epoch_batch_with_worker_traceback(pool):
    batches = [{"i": i, "fail": i == 3} for i in range(8)]
    with pytest.raises(TransformError) as caught:
        list(pool.map(batches, epoch=5))
    err = caught.value
    text = str(err)
    assert isinstance(err, DatasetError)
    assert (err.dataset, err.epoch, err.batch) == ("generic", 5, 3)
    assert "dataset 'generic'" in text and "batch 3 of epoch 5" in text and "in worker process" in text
    assert "ValueError: bad pixel in 3" in text
    assert "Traceback (most recent call last)" in text and "in generic" in text  # the worker's own frames
    assert "in generic" in err.worker_traceback
    again = pickle.loads(pickle.dumps(err))  # it crosses to the driver intact
    assert (again.dataset, again.epoch, again.batch, str(again)) == ("generic", 5, 3, text)
    # The pool goes on: the failed epoch's answers still in flight are dropped.
    assert [int(b["i"]) for b in pool.map([{"i": i} for i in range(4)], epoch=6)] == [0, 1, 2, 3]

    # Run in the rank (workers=0), it says so; `start` numbers the batches from a resumed position.
    inline = TransformWorkers(_generic_fn(), workers=0, dataset="generic")
    with pytest.raises(TransformError, match=r"batch 11 of epoch 2 \(in the training process\): ValueError: bad"):
        list(inline.map([{"i": 0}, {"i": 1, "fail": True}], epoch=2, start=10))


def test_not_a_dict_without_collate_is_a_transform_error(pool):
    with pytest.raises(TransformError, match=r"batch 0 of epoch 0.*returned a list.*collate="):
        list(pool.map([{"i": 0, "as_list": True}], epoch=0))


def test_collate_turns_per_example_outputs_into_the_batch():
    def tokens(batch):  # per example: a variable-length tensor
        return [torch.arange(n) for n in batch["lengths"]]

    def pad(examples):
        out = torch.zeros(len(examples), max(len(e) for e in examples), dtype=torch.long)
        for row, e in enumerate(examples):
            out[row, :len(e)] = e
        return {"tokens": out, "lengths": torch.tensor([len(e) for e in examples])}

    batches = [{"lengths": [1, 3, 2]}, {"lengths": [4]}]
    inline = list(transformed(batches, tokens, collate=pad, workers=0, dataset="text", epoch=0))
    assert inline[0]["tokens"].tolist() == [[0, 0, 0], [0, 1, 2], [0, 1, 0]]
    same(inline, list(transformed(batches, tokens, collate=pad, workers=1, dataset="text", epoch=0)))


def test_no_workers_gives_the_same_tensors_as_two(pool):
    batches = [{"i": i, "delay": 0.02 * (i % 3)} for i in range(10)]
    parallel = list(pool.map(batches, epoch=3))
    torch.manual_seed(123)
    np.random.seed(5)
    inline = list(TransformWorkers(_generic_fn(), workers=0, dataset="generic", seed=7).map(batches, epoch=3))
    same(parallel, inline)
    # The seed is per batch and per epoch, and running inline left the caller's generators where they were.
    assert len({int(b["seed"]) for b in parallel}) == 10
    assert int(list(pool.map(batches[:1], epoch=4))[0]["seed"]) != int(parallel[0]["seed"])
    after = torch.rand(1), np.random.rand()
    torch.manual_seed(123)
    np.random.seed(5)
    assert torch.equal(after[0], torch.rand(1)) and after[1] == np.random.rand()
    with pytest.raises(RuntimeError, match="only available inside a transform"):
        batch_seed()


def test_abandoned_epoch_is_dropped_and_next_epoch_is_whole(pool):
    batches = [{"i": i, "delay": 0.05} for i in range(10)]
    first = pool.map(batches, epoch=0)
    assert int(next(first)["i"]) == 0 and int(next(first)["i"]) == 1
    second = list(pool.map(batches, epoch=1))  # the first epoch's batches in flight are dropped
    same(second, list(TransformWorkers(_generic_fn(), workers=0, dataset="g", seed=7).map(batches, epoch=1)))
    with pytest.raises(RuntimeError, match="abandoned"):
        next(first)
    for epoch in range(5):  # abandoned again and again: their batches still count against the bound
        next(pool.map(batches, epoch=epoch))
        assert sum(map(len, pool._sent)) <= pool.in_flight


def test_wait_seconds_counts_the_transform_not_the_input():
    def slow_input():
        for i in range(4):
            time.sleep(0.3)
            yield {"i": i}

    def fn(batch):
        time.sleep(0.05)
        return {"i": torch.tensor(batch["i"])}

    inline = TransformWorkers(fn, workers=0, dataset="timed")
    assert len(list(inline.map(slow_input(), epoch=0))) == 4
    assert 0.2 <= inline.wait_seconds < 1.0 and inline.batches == 4  # not the input's 1.2 s


def test_jpeg_decode_and_augment_same_tensors_with_0_and_2_workers():
    from PIL import Image

    rng = np.random.default_rng(0)

    def jpeg():
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        return buf.getvalue()

    images = [jpeg() for _ in range(24)]
    batches = [{"image": images[i:i + 6], "label": np.arange(i, i + 6)} for i in range(0, 24, 6)]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def decode_augment(batch):
        out = []
        for data in batch["image"]:
            img = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())
            img = img.permute(2, 0, 1).float() / 255
            top, left = torch.randint(0, 17, (2,)).tolist()  # random 48x48 crop
            img = img[:, top:top + 48, left:left + 48]
            if torch.rand(()) < 0.5:
                img = img.flip(-1)
            out.append((img - mean) / std)
        return {"image": torch.stack(out), "label": torch.as_tensor(batch["label"])}

    inline = list(transformed(batches, decode_augment, workers=0, dataset="jpegs", epoch=2, seed=11))
    parallel = list(transformed(batches, decode_augment, workers=2, dataset="jpegs", epoch=2, seed=11))
    assert inline[0]["image"].shape == (6, 3, 48, 48) and inline[0]["image"].dtype == torch.float32
    same(inline, parallel)
    other_epoch = list(transformed(batches, decode_augment, workers=0, dataset="jpegs", epoch=3, seed=11))
    assert not torch.equal(inline[0]["image"], other_epoch[0]["image"])


def test_lambda_works_as_transform():
    scale = 3
    with TransformWorkers(lambda b: {"y": b["x"] * scale}, workers=1, dataset="lambdas") as workers:
        out = list(workers.map([{"x": torch.arange(3) + i} for i in range(3)], epoch=0))
    assert [b["y"].tolist() for b in out] == [[0, 3, 6], [3, 6, 9], [6, 9, 12]]


def test_transform_that_cannot_be_pickled_is_a_clear_error():
    lock = threading.Lock()
    before = children()
    with pytest.raises(TransformPickleError) as caught:
        TransformWorkers(lambda b: (lock, b)[1], workers=2, dataset="locked")
    assert isinstance(caught.value, DatasetError) and isinstance(caught.value, TypeError)
    assert caught.value.dataset == "locked"
    assert "dataset 'locked'" in str(caught.value) and "workers=0" in str(caught.value)
    assert children() == before  # nothing was started
    TransformWorkers(lambda b: (lock, b)[1], workers=0, dataset="locked").close()  # in the rank it needs no pickling


def test_no_worker_outlives_close_or_garbage_collection():
    def fn(batch):
        time.sleep(batch["sleep"])
        return {"x": torch.tensor(0)}

    workers = TransformWorkers(fn, workers=2, dataset="lifetime")
    pids = set(workers.pids)
    assert len(pids) == 2 and pids <= children()
    it = workers.map([{"sleep": 0.0}] + [{"sleep": 60.0}] * 3, epoch=0)
    next(it)  # both workers are now inside a minute-long transform
    t0 = time.monotonic()
    workers.close()
    assert time.monotonic() - t0 < 30  # close() does not wait for the minute-long transforms
    assert not pids & children() and not any(alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        next(it)

    collected = TransformWorkers(fn, workers=1, dataset="lifetime")
    pids = set(collected.pids)
    del collected
    gc.collect()
    assert not pids & children() and not any(alive(p) for p in pids)


def test_one_interpreter_is_started_and_forks_the_other_workers():
    with TransformWorkers(lambda b: {"pid": torch.tensor(os.getpid())}, workers=3, dataset="forked") as workers:
        first, *forked = workers.pids
        assert psutil.Process(first).ppid() == os.getpid() and len(forked) == 2  # the rank starts one
        assert [psutil.Process(pid).ppid() for pid in forked] == [first, first]  # which forks the others
        answered = {int(b["pid"]) for b in workers.map([{}] * 6, epoch=0)}
        assert answered == {first, *forked}  # and every one of them transforms batches


# With two workers, batch 1 goes to the forked one: its exit code reaches the rank too.
@pytest.mark.parametrize("k", [1, 2])
def test_worker_that_dies_is_a_transform_error(k):
    def fn(batch):
        if batch["i"] == 1:
            os._exit(3)
        return {"i": torch.tensor(batch["i"])}

    workers = TransformWorkers(fn, workers=k, dataset="dying")
    pids = set(workers.pids)
    with pytest.raises(TransformError, match=r"exited with code 3 while transforming batch 1 of epoch 0"):
        list(workers.map([{"i": i} for i in range(4)], epoch=0))
    with pytest.raises(TransformError, match="exited with code 3"):
        workers.map([{"i": 0}], epoch=1)
    assert not any(alive(p) for p in pids)


_ORPHAN_SCRIPT = """
import threading, time
from spark_dist.data.read.transform_workers import TransformWorkers
pools = [TransformWorkers(lambda b: b, workers=1, dataset="main")]  # from the main thread
t = threading.Thread(target=lambda: pools.append(TransformWorkers(lambda b: b, workers=1, dataset="thread")))
t.start(); t.join()  # from a thread that has ended: the workers must outlive it
for p in pools:
    list(p.map([{"x": 1}], epoch=0))
print(*[pid for p in pools for pid in p.pids], flush=True)
time.sleep(600)
"""


def test_workers_die_with_the_rank_process():
    rank = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in rank.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)  # the thread's worker lived past its thread
    finally:
        rank.send_signal(signal.SIGKILL)  # no close(), no atexit: only the workers' own watch can end them
        rank.wait()
        rank.stdout.close()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_workers_start_in_a_rank_with_a_gloo_process_group():
    import torch.distributed as dist
    from free_ports import free_ports

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)}", rank=0, world_size=1)
    try:
        total = torch.ones(2)
        dist.all_reduce(total)  # the group's threads are running
        with TransformWorkers(lambda b: {"x": b["x"] * 2}, workers=2, dataset="after_gloo") as workers:
            out = list(workers.map([{"x": torch.tensor([i])} for i in range(6)], epoch=0))
        assert [int(b["x"]) for b in out] == [0, 2, 4, 6, 8, 10]
        dist.all_reduce(total)  # and the group still works
        assert total.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_a_later_batchs_error_waits_for_the_batches_before_it(pool):
    # Batch 1 fails at once on the second worker while batch 0 is still being transformed on the first.
    it = pool.map([{"i": 0, "delay": 1.0}, {"i": 1, "fail": True}, {"i": 2}], epoch=9)
    assert int(next(it)["i"]) == 0
    with pytest.raises(TransformError, match=r"batch 1 of epoch 9.*bad pixel in 1"):
        next(it)
    assert [int(b["i"]) for b in pool.map([{"i": i} for i in range(3)], epoch=10)] == [0, 1, 2]


def test_an_answer_out_of_order_is_a_runtime_error_that_closes_the_pool(monkeypatch):
    from spark_dist.data.read import transform_workers

    real_recv = transform_workers.recv

    def shifted(sock):  # a worker whose answers name another batch than the one it was sent
        message = real_recv(sock)
        return message[:2] + (message[2] + 100,) + message[3:] if message[0] == "ok" else message

    workers = TransformWorkers(lambda b: {"x": b["x"]}, workers=1, dataset="garbled")
    pids = set(workers.pids)
    monkeypatch.setattr(transform_workers, "recv", shifted)
    with pytest.raises(RuntimeError, match=r"dataset 'garbled'.*answered batch 100 .* batch 0 was due"):
        list(workers.map([{"x": torch.tensor(1)}], epoch=0))
    assert not any(alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="answered batch 100"):
        workers.map([{"x": torch.tensor(1)}], epoch=1)


def test_a_worker_that_never_comes_up_is_an_error_naming_it_and_the_pool_is_closed(tmp_path, monkeypatch):
    # Its interpreter hangs before its first message, as an import from an unreachable filesystem would.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(3600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(transform_workers, "START_TIMEOUT_S", 1.0)
    workers = TransformWorkers(lambda batch: batch, workers=2, dataset="slow start", timeout=0.5)
    proc = workers._procs[0]
    with pytest.raises(TransformError, match=r"^dataset 'slow start': transform worker 0 did not start within 1 s "
                                             r"\(it was to transform batch 0 of epoch 3\)") as caught:
        list(workers.map([{"i": torch.tensor(i)} for i in range(4)], epoch=3))
    assert (caught.value.epoch, caught.value.batch) == (3, 0)
    assert proc.poll() is not None  # stopped with the pool


def test_a_worker_stuck_past_the_timeout_is_an_error_naming_it_and_the_pool_is_closed():
    def fn(batch):
        if batch["i"] == 1:
            time.sleep(3600)  # a deadlock in a tokenizer, a network read that never returns
        return {"i": torch.tensor(batch["i"])}

    with pytest.raises(ValueError, match="timeout=-1"):
        TransformWorkers(fn, workers=1, dataset="stuck", timeout=-1)
    workers = TransformWorkers(fn, workers=2, dataset="stuck", timeout=2.0)
    first, forked = workers.pids  # both up: batch 1 goes to the forked worker
    t0 = time.monotonic()
    with pytest.raises(TransformError) as caught:
        list(workers.map([{"i": i} for i in range(4)], epoch=4))
    assert time.monotonic() - t0 < 30
    err = caught.value
    assert (err.dataset, err.epoch, err.batch) == ("stuck", 4, 1)
    assert f"worker process {forked} " in str(err) and "batch 1 of epoch 4" in str(err) and "timeout=2" in str(err)
    assert not alive(first) and not alive(forked) and not {first, forked} & children()
    with pytest.raises(TransformError, match="timeout=2"):
        workers.map([{"i": 0}], epoch=5)
