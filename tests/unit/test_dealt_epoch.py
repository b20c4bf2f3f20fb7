"""spark_dist.data.dealt_epoch: an elastic run that changes its number of ranks inside an epoch goes on with the
rest of that epoch, dealt out to the new ranks, every row once. No JVM."""
import pytest
import torch

from spark_dist.data import make_loader
from spark_dist.data.dealt_epoch import my_units, steps
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
    from spark_dist.data.dealt_epoch import deals_evenly, loader_states

    one = make_loader(small_dataset, rank=0, world_size=1, batch_size=24, seed=5)  # 41 batches an epoch
    it = iter(one)
    next(it)  # 40 batches left: 20 steps on 2 ranks, not a whole number on 3
    assert deals_evenly(one.state_dict(), 2) and not deals_evenly(one.state_dict(), 3)
    next(it)  # 39 left
    assert not deals_evenly(one.state_dict(), 2) and deals_evenly(one.state_dict(), 3)
    it.close()
    assert loader_states({"model": {}, "loader": one, "step": 3}) == [one.state_dict()]
    assert loader_states({"loader": one.state_dict()}) == [one.state_dict()] and loader_states([1]) == []
