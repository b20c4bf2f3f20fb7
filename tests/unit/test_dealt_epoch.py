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


def test_where_each_dealt_unit_comes_from_and_the_readers_that_make_them():
    from spark_dist.data.read.dealt_epoch import epoch_units, origins, reads

    # 1,000 rows on 4 ranks in batches of 24: 10 batches each with drop_last (250 rows), else 11: 40 or 44 units.
    assert (epoch_units(1000, 4, 24, True), epoch_units(1000, 4, 24, False)) == (40, 44)
    # After 3 steps of 4 ranks (12 units), new rank 0 of 3 takes units 12, 15, 18, ...: batch 3 of old rank 0,
    # batch 3 of old rank 3, batch 4 of old rank 2, ...
    assert origins(40, 12, 4, 3, 0, True)[:4] == [(0, 3), (3, 3), (2, 4), (1, 5)]
    # Consecutive batches of one old rank are made by one reader; a gap or another rank opens the next.
    assert reads([(2, 3), (2, 4), (2, 5), (0, 6), (0, 8), (1, 8), (1, 9)]) == [
        (2, 3, 3), (0, 6, 1), (0, 8, 1), (1, 8, 2)]
    assert reads([]) == []
    # Nothing left to deal: no step, with or without drop_last (nor past the end).
    assert steps(40, 40, 3, drop_last=False) == steps(40, 40, 3, drop_last=True) == steps(40, 41, 3, False) == 0
    assert steps(40, 39, 3, drop_last=False) == 1 and steps(40, 39, 3, drop_last=True) == 0


def test_the_place_of_a_state_counts_units_of_the_world_its_epoch_began_on():
    from spark_dist.data.read.dealt_epoch import deals_evenly, place

    whole = {"epoch": 2, "batches": 3, "world_size": 4, "num_rows": 1000, "batch_size": 24, "drop_last": True}
    assert place(whole) == (4, 12)
    dealt = {**whole, "world_size": 3, "batches": 2, "origin": {"world_size": 4, "position": 18}}
    assert place(dealt) == (4, 18)
    # 22 of the 40 units left: even on 2 ranks (and on 11), not on 3 or 4.
    assert [n for n in range(1, 12) if deals_evenly(dealt, n)] == [1, 2, 11]
    # Without drop_last the epoch has 44 units: 26 left.
    assert [n for n in range(1, 14) if deals_evenly({**dealt, "drop_last": False}, n)] == [1, 2, 13]


def test_shrunk_then_grown_back_off_a_step_boundary_each_rank_reads_one_run(small_dataset, monkeypatch):
    # 4 ranks take 3 steps (12 units), 2 ranks take one more (14): 4 ranks again go on from unit 14, where each
    # rank's units are consecutive batches of one old rank, made by one reader.
    from spark_dist.data.read import loader as loader_module
    from spark_dist.data.read.dealt_epoch import places, reads

    four = loaders(small_dataset, 4)
    before, _ = take(four, 3)
    two = loaders(small_dataset, 2)
    for loader in two:
        loader.load_state_dict(four[0].state_dict())
    middle, its = take(two, 1)
    state = two[0].state_dict()
    for it in its:
        it.close()
    assert state["origin"] == {"world_size": 4, "position": 14}
    regrown = loaders(small_dataset, 4)
    for loader in regrown:
        loader.load_state_dict(state)
    assert [reads(places(loader, 4, 14)) for loader in regrown] == [
        [(2, 3, 6)], [(3, 3, 6)], [(0, 4, 6)], [(1, 4, 6)]]  # 6 steps each; units 38 and 39 left out
    readers = []
    real = loader_module.ShardLoader._peer
    monkeypatch.setattr(loader_module.ShardLoader, "_peer",
                        lambda self, *args: readers.append(real(self, *args)) or readers[-1])
    after = [list(loader) for loader in regrown]
    assert len(readers) == 4
    uninterrupted = [list(loader) for loader in loaders(small_dataset, 4)]
    for r, (old, first) in enumerate([(2, 3), (3, 3), (0, 4), (1, 4)]):
        assert batches_equal(after[r], uninterrupted[old][first:first + 6])
    everything = ids(b for rank in before + middle + after for b in rank)
    assert len(everything) == len(set(everything)) == 38 * 24


def test_a_dealt_epochs_batches_with_where_each_belongs_and_the_readers_times(small_dataset, monkeypatch):
    from spark_dist.data.read import loader as loader_module
    from spark_dist.data.read.dealt_epoch import dealt_batches, places

    four = loaders(small_dataset, 4)
    uninterrupted = [list(loader) for loader in four]
    two = loaders(small_dataset, 2)[1]
    readers = []
    real = loader_module.ShardLoader._peer
    monkeypatch.setattr(loader_module.ShardLoader, "_peer",
                        lambda self, *args: readers.append(real(self, *args)) or readers[-1])
    got = list(dealt_batches(two, 2, 4, 12))
    # Rank 1 of 2 takes units 13, 15, 17, ...: batches 3 to 9 of old ranks 1 and 3 in turn, 14 steps.
    assert [where for where, _ in got] == places(two, 4, 12) == [(r, b) for b in range(3, 10) for r in (1, 3)]
    assert batches_equal([batch for _, batch in got], [uninterrupted[r][b] for r, b in places(two, 4, 12)])
    # Each reader's waiting and reading add up in the loader the training loop holds.
    assert len(readers) == len(got) > 1
    assert two.wait_seconds == pytest.approx(sum(r.wait_seconds for r in readers)) and two.wait_seconds > 0
    assert two.read_seconds == pytest.approx(sum(r.read_seconds for r in readers)) and two.read_seconds > 0


def test_progress_in_a_dealt_epoch_counts_its_steps(small_dataset):
    four = loaders(small_dataset, 4)
    take(four, 3)
    three = loaders(small_dataset, 3)[0]
    three.load_state_dict(four[0].state_dict())
    seen = []
    three.on_progress = lambda epoch, batches, total: seen.append((epoch, batches, total))
    list(three)
    assert seen == [(2, b, 9) for b in range(1, 10)]  # 28 units left on 3 ranks: 9 steps
    kept = loaders(small_dataset, 3, drop_last=False)[0]
    kept.load_state_dict({**four[0].state_dict(), "drop_last": False, "batches": 3})
    kept.on_progress = lambda epoch, batches, total: seen.append((epoch, batches, total))
    list(kept)
    assert seen[9:] == [(2, b, 11) for b in range(1, 12)]  # 44 - 12 = 32 units: 11 steps, one filled from the start


def test_a_checkpoint_lists_its_loaders_states_without_asking_anything_else_for_its_state(small_dataset):
    from spark_dist.data.read.dealt_epoch import loader_states

    class ShardedModel(torch.nn.Linear):
        def state_dict(self, *args, **kwargs):  # FSDP's: a collective, which rank 0 alone must not enter
            raise AssertionError("state_dict called on rank 0 alone")

    class Stream:
        handle = "a file handle"  # something with a handle but no state: not a loader

    one = make_loader(small_dataset, rank=0, world_size=1, batch_size=24)
    checkpoint = {"model": ShardedModel(2, 2), "optimizer": {"state": {}}, "stream": Stream(), "loader": one,
                  "saved": one.state_dict(), "step": 7}
    assert loader_states(checkpoint) == [one.state_dict(), one.state_dict()]
