"""spark_dist.data.read.dealt_epoch: an elastic run that changes its number of ranks inside an epoch goes on with
the rest of that epoch, dealt out to the new ranks, every row once. No JVM."""
import pytest
import torch

from spark_dist.data import make_loader
from spark_dist.data.read.dealt_epoch import my_units, steps
from test_loader import batches_equal, small_dataset  # noqa: F401 -- the fixture


def loaders(handle, world_size, **kwargs):
    return [make_loader(handle, rank=r, world_size=world_size, batch_size=24, seed=5, epoch=2, **kwargs)
            for r in range(world_size)]


def take(ranks, count):
    """``count`` steps of every rank (its iterators kept going), the batches by rank."""
    its = [iter(loader) for loader in ranks]
    return [[next(it) for _ in range(count)] for it in its], its


def ids(batches):
    return [i for b in batches for i in b["id"].tolist()]


def test_units_from_a_position_go_round_the_new_ranks_in_step_order():
    # 4 ranks took 3 steps of 10 (12 units of 40); 3 ranks deal the remaining 28: 9 steps each, one unit left out.
    assert steps(40, 12, 3, drop_last=True) == 9 and steps(40, 12, 3, drop_last=False) == 10
    dealt = [my_units(40, 12, 3, r, drop_last=True) for r in range(3)]
    assert dealt[0][:3] == [12, 15, 18] and dealt[2][-1] == 12 + 2 + 8 * 3
    assert sorted(u for d in dealt for u in d) == list(range(12, 39))
    # drop_last=False fills the last step from the start of what was left: every unit at least once.
    padded = [my_units(40, 12, 3, r, drop_last=False) for r in range(3)]
    assert {u for d in padded for u in d} == set(range(12, 40)) and {len(d) for d in padded} == {10}


def test_four_ranks_shrunk_to_two_mid_epoch_then_grown_back_take_every_row_once(small_dataset):
    four = loaders(small_dataset, 4)
    before, _ = take(four, 3)
    state = four[0].state_dict()  # rank 0's state serves every rank
    two = loaders(small_dataset, 2)
    for loader in two:
        loader.load_state_dict(state)
    assert two[0].epoch == 2
    middle, its = take(two, 2)  # 2 steps on 2 ranks: position 12 + 4
    grown_state = two[1].state_dict()
    assert grown_state["origin"] == {"world_size": 4, "position": 16}
    regrown = loaders(small_dataset, 4)
    for loader in regrown:
        loader.load_state_dict(grown_state)  # 16 units on 4 ranks: batch 4 of the 4-rank epoch, as if never shrunk
    after = [list(loader) for loader in regrown]
    assert {len(a) for a in after} == {len(four[0]) - 4}
    uninterrupted = [list(loader) for loader in loaders(small_dataset, 4)]
    for r in range(4):
        assert batches_equal(after[r], uninterrupted[r][4:])
        assert batches_equal(before[r], uninterrupted[r][:3])
    # The 2-rank steps took the 4-rank epoch's batch 3 of every old rank, each exactly as it was.
    assert batches_equal([middle[0][0], middle[1][0], middle[0][1], middle[1][1]],
                         [uninterrupted[r][3] for r in range(4)])
    everything = ids(b for rank in before + middle + after for b in rank)
    assert len(everything) == len(set(everything)) == 4 * len(four[0]) * 24
    for it in its:
        it.close()


def test_the_rest_of_a_dealt_epoch_on_three_ranks_and_its_state_on_the_same_ranks(small_dataset):
    four = loaders(small_dataset, 4)
    before, _ = take(four, 2)
    three = loaders(small_dataset, 3)
    for loader in three:
        loader.load_state_dict(four[2].state_dict())
    got = [list(loader) for loader in three]
    units = 4 * len(four[0])
    assert {len(g) for g in got} == {steps(units, 8, 3, drop_last=True)}
    seen = ids(b for rank in before + got for b in rank)
    assert len(seen) == len(set(seen)) == (8 + 3 * steps(units, 8, 3, True)) * 24  # the remainder unit left out
    assert three[0].state_dict()["batches"] == three[0].state_dict()["epoch_batches"]  # the dealt epoch's end
    # A checkpoint inside the dealt epoch resumes it on the same 3 ranks: the same batches from there on.
    again = loaders(small_dataset, 3)
    for loader in again:
        loader.load_state_dict(four[2].state_dict())
    its = [iter(loader) for loader in again]
    for it in its:
        next(it), next(it)
    mid = again[0].state_dict()
    for it in its:
        it.close()
    resumed = loaders(small_dataset, 3)
    for loader in resumed:
        loader.load_state_dict(mid)
    for r in range(3):
        assert batches_equal(list(resumed[r]), got[r][2:])
    resumed[0].set_epoch(3)  # the next epoch is whole, on 3 ranks
    assert batches_equal(list(resumed[0]), list(make_loader(small_dataset, rank=0, world_size=3, batch_size=24,
                                                            seed=5, epoch=3)))


def test_a_transformed_loader_deals_the_same_batches(small_dataset):
    def double(batch):
        return {"id": batch["id"] * 2}

    four = loaders(small_dataset, 4)
    take(four, 1)
    plain, transformed = loaders(small_dataset, 2), loaders(small_dataset, 2, transform=double)
    for loader in plain + transformed:
        loader.load_state_dict(four[0].state_dict())
    for p, t in zip(plain, transformed):
        got = list(t)
        assert [torch.equal(g["id"], e["id"] * 2) for g, e in zip(got, list(p))] == [True] * len(got)
        assert t.state_dict()["origin"] == p.state_dict()["origin"]


def test_another_batch_size_inside_an_epoch_is_still_refused(small_dataset):
    from spark_dist.data import DatasetError

    four = loaders(small_dataset, 4)
    take(four, 1)
    with pytest.raises(DatasetError, match="batch_size=24 .*another batch size resumes at an epoch's start"):
        make_loader(small_dataset, rank=0, world_size=2, batch_size=48).load_state_dict(four[0].state_dict())


def test_a_grow_waits_for_a_place_that_deals_out_evenly(small_dataset):
    from spark_dist.data.read.dealt_epoch import deals_evenly, loader_states

    one = make_loader(small_dataset, rank=0, world_size=1, batch_size=24, seed=5)  # 41 batches an epoch
    it = iter(one)
    next(it)  # 40 batches left: 20 steps on 2 ranks, not a whole number on 3
    assert deals_evenly(one.state_dict(), 2) and not deals_evenly(one.state_dict(), 3)
    next(it)  # 39 left
    assert not deals_evenly(one.state_dict(), 2) and deals_evenly(one.state_dict(), 3)
    it.close()
    assert loader_states({"model": {}, "loader": one, "step": 3}) == [one.state_dict()]
    assert loader_states({"loader": one.state_dict()}) == [one.state_dict()] and loader_states([1]) == []


@pytest.fixture
def thirty_two_ranks(tmp_path, monkeypatch):
    """3,080 rows: 32 ranks of 24 batches of 4 rows, in row groups of 90, shuffle windows of 40 rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dist.data.read import epoch_order, loader as loader_module
    from spark_dist.data.handle import describe_files

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", 40 * 8)
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": np.arange(3080)}), path, row_group_size=90)
    return describe_files("many", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar"}, {})


def test_a_rank_after_losing_one_of_32_reads_what_it_yields_with_one_reader_at_a_time(thirty_two_ranks, monkeypatch):
    import threading

    from spark_dist.data.read import loader as loader_module

    def loader(rank, world_size):
        return make_loader(thirty_two_ranks, rank=rank, world_size=world_size, batch_size=4, seed=5, epoch=1)

    uninterrupted = [list(loader(r, 32)) for r in range(32)]
    assert {len(u) for u in uninterrupted} == {24}
    state = {**loader(0, 32).state_dict(), "batches": 1}  # every rank took one step, then one rank was lost
    made = [0]
    real = loader_module.ShardLoader._to_torch
    monkeypatch.setattr(loader_module.ShardLoader, "_to_torch",
                        lambda self, *args: made.__setitem__(0, made[0] + 1) or real(self, *args))
    for rank in (0, 17, 30):
        dealt = loader(rank, 31)
        dealt.load_state_dict(state)
        made[0], most_threads, got = 0, 0, []
        before = threading.active_count()
        for batch in dealt:
            most_threads = max(most_threads, threading.active_count())
            got.append(batch)
        units = my_units(32 * 24, 32, 31, rank, drop_last=True)
        assert batches_equal(got, [uninterrupted[q % 32][q // 32] for q in units])
        # Every batch it read it yielded (a reader opened at the batch it needs, no further than it needs) ...
        assert made[0] <= 1.1 * len(got)
        # ... and one reader at a time: its thread and its two decoding threads, the one before it closed.
        assert most_threads <= before + 3
        assert threading.active_count() == before


def test_a_dealt_epoch_draws_the_augmentation_the_uninterrupted_one_drew_for_each_batch(small_dataset):
    def noisy(batch):
        return {"id": batch["id"], "noise": torch.rand(2)}

    uninterrupted = [list(loader) for loader in loaders(small_dataset, 4, transform=noisy)]
    four = loaders(small_dataset, 4)
    take(four, 3)
    for world_size in (2, 3):
        dealt = loaders(small_dataset, world_size, transform=noisy)
        for loader in dealt:
            loader.load_state_dict(four[0].state_dict())
        units = 4 * len(four[0])
        for rank, loader in enumerate(dealt):
            got = list(loader)
            expected = [uninterrupted[q % 4][q // 4] for q in my_units(units, 12, world_size, rank, True)]
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert torch.equal(g["id"], e["id"]) and torch.equal(g["noise"], e["noise"])
