"""make_loader(..., transform=fn, workers=k): the loader's batches, in its order, through a user's transform in
worker processes; its place in an epoch is what the training loop got, not what the workers hold."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spark_dist.data import make_loader
from spark_dist.data.handle import describe_files
from spark_dist.data.read.transform_workers import TransformError


@pytest.fixture
def texts(tmp_path):
    """600 rows: an id and a text whose length the transform turns into a tensor."""
    path = tmp_path / "part-0.parquet"
    ids = np.arange(600)
    pq.write_table(pa.table({"id": ids, "text": pa.array(["x" * (i % 7) for i in ids])}), path, row_group_size=64)
    return describe_files("texts", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar", "text": "string"}, {})


def text_lengths(batch):
    """The transform: each text's length beside the ids, plus a draw from torch's seeded generator."""
    return {"id": batch["id"], "length": torch.tensor([len(t) for t in batch["text"]]), "noise": torch.rand(1)}


def loader(handle, **kwargs):
    return make_loader(handle, rank=1, world_size=2, batch_size=32, seed=3, epoch=1, **kwargs)


def test_workers_yield_the_loaders_batches_transformed_in_order(texts):
    plain = [text_lengths(b) for b in loader(texts)]
    in_thread = list(loader(texts, transform=text_lengths, workers=0))
    in_workers = loader(texts, transform=text_lengths, workers=2)
    try:
        got = list(in_workers)
    finally:
        in_workers.close()
    assert len(got) == len(plain) == len(in_workers) == 9
    for a, b, c in zip(plain, in_thread, got):
        assert torch.equal(a["id"], b["id"]) and torch.equal(b["id"], c["id"])
        assert torch.equal(a["length"], c["length"])
        assert torch.equal(b["noise"], c["noise"])  # seeded from (seed, epoch, batch), wherever it runs
    assert in_workers.batches == 9 and in_workers.rows == 9 * 32


def test_a_mid_epoch_state_counts_what_the_loop_got_and_resumes_there(texts):
    whole = list(loader(texts, transform=text_lengths))
    interrupted = loader(texts, transform=text_lengths)
    batches = iter(interrupted)
    got = [next(batches) for _ in range(4)]
    state = interrupted.state_dict()
    batches.close()
    assert (state["epoch"], state["batches"]) == (1, 4)
    resumed = loader(texts, transform=text_lengths)
    resumed.set_epoch(0)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 4
    for a, b in zip(got + rest, whole):
        assert torch.equal(a["id"], b["id"]) and torch.equal(a["noise"], b["noise"])


def test_a_failing_transform_names_the_dataset_epoch_and_batch(texts):
    def fails_on_the_third(batch):
        if int(batch["id"][0]) == third:
            raise ValueError("bad image")
        return {"id": batch["id"]}

    third = int(list(loader(texts))[2]["id"][0])
    with pytest.raises(TransformError, match=r"dataset 'texts'.*batch 2 of epoch 1.*bad image"):
        list(loader(texts, transform=fails_on_the_third))


@pytest.mark.parametrize("kwargs, message", [
    ({"transform": text_lengths, "workers": -1}, "workers=-1"),
    ({"collate": list}, "collate= turns what transform= returns"),
])
def test_bad_transform_arguments_are_named(texts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        loader(texts, **kwargs)


def noisy(batch):
    """The transform of the seeding tests: the ids and a draw from torch's seeded generator."""
    return {"id": batch["id"], "noise": torch.rand(4)}


def test_two_ranks_never_draw_the_same_augmentation_for_a_batch(texts):
    def rank(r, **kwargs):
        return make_loader(texts, rank=r, world_size=2, batch_size=32, seed=3, epoch=1, transform=noisy, **kwargs)

    zero, one = list(rank(0)), list(rank(1))
    assert len(zero) == len(one) == 9
    assert all(not torch.equal(a["noise"], b["noise"]) for a, b in zip(zero, one))
    in_workers = rank(1, workers=1)
    try:
        for a, b in zip(one, list(in_workers)):  # the rank is in the seed wherever the transform runs
            assert torch.equal(a["noise"], b["noise"])
    finally:
        in_workers.close()


def test_a_seed_restored_after_the_first_iteration_reaches_the_transform(texts):
    restored = loader(texts, transform=noisy)
    list(restored)  # the transform stage is set up with seed 3
    restored.load_state_dict({**restored.state_dict(), "seed": 8, "batches": 2})
    fresh = make_loader(texts, rank=1, world_size=2, batch_size=32, seed=8, epoch=1, transform=noisy)
    expected = list(fresh)[2:]
    got = list(restored)
    assert len(got) == len(expected) == 7
    for a, b in zip(got, expected):
        assert torch.equal(a["id"], b["id"]) and torch.equal(a["noise"], b["noise"])


def test_a_transform_stuck_on_a_batch_times_out_naming_the_worker_batch_and_epoch(texts):
    import time

    import psutil

    def stuck_on_the_second(batch):
        if int(batch["id"][0]) == second:
            time.sleep(3600)
        return {"id": batch["id"]}

    second = int(list(loader(texts))[1]["id"][0])
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    stuck = loader(texts, transform=stuck_on_the_second, workers=1, timeout=2)
    t0 = time.monotonic()
    with pytest.raises(TransformError, match=r"worker process \d+ .*batch 1 of epoch 1.*timeout=2") as caught:
        list(stuck)
    assert time.monotonic() - t0 < 60 and (caught.value.epoch, caught.value.batch) == (1, 1)
    deadline = time.monotonic() + 10
    while {c.pid for c in psutil.Process().children(recursive=True)} - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {c.pid for c in psutil.Process().children(recursive=True)} - before  # the pool was closed
    with pytest.raises(ValueError, match="timeout=0"):
        loader(texts, transform=stuck_on_the_second, timeout=0)
