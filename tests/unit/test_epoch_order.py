"""spark_dist.data.read.epoch_order: which rows each rank takes in an epoch, as positions in the row groups, and
the order of the blocks inside a row group. Pure functions of the row groups' sizes and ``(seed, epoch)``; no
files, no JVM."""
import numpy as np
import pytest

from spark_dist.data.read import epoch_order
from spark_dist.data.read.epoch_order import (batches_per_rank, block_runs, merged, rows_per_rank, shard_pieces,
                                              window_batches)


def pieces(sizes, world_size, rank, *, shuffle=False, drop_last=True, seed=0, epoch=0):
    return shard_pieces(sizes, world_size=world_size, rank=rank, epoch=epoch, seed=seed, shuffle=shuffle,
                        drop_last=drop_last)


def rows_taken(found):
    """``(row group, position)`` of every row in ``pieces``, in order."""
    return [(group, at) for group, start, stop in found for at in range(start, stop)]


def test_each_rank_takes_the_same_rows_and_batches_however_the_rows_divide():
    # 10 rows on 3 ranks: 3 each with drop_last (one row left out), else 4 each (two rows repeated).
    assert (rows_per_rank(10, 3, drop_last=True), rows_per_rank(10, 3, drop_last=False)) == (3, 4)
    assert rows_per_rank(9, 3, drop_last=True) == rows_per_rank(9, 3, drop_last=False) == 3
    # 100 rows on 3 ranks in batches of 16: 33 rows make 2 full batches; 34 rows make 3, the last of 2 rows.
    assert batches_per_rank(100, 3, 16, drop_last=True) == 2
    assert batches_per_rank(100, 3, 16, drop_last=False) == 3
    assert batches_per_rank(96, 3, 16, drop_last=True) == batches_per_rank(96, 3, 16, drop_last=False) == 2
    # 47 rows on 3 ranks in batches of 16: 15 rows each make no full batch; 16 rows each make one.
    assert (batches_per_rank(47, 3, 16, drop_last=True), batches_per_rank(47, 3, 16, drop_last=False)) == (0, 1)


def test_without_shuffle_the_ranks_take_consecutive_stretches_of_the_file_order():
    # Three row groups of 100 rows on 2 ranks: rank 0 the first 150 rows, rank 1 the next 150, across row groups.
    assert pieces([100, 100, 100], 2, 0) == ([(0, 0, 100), (1, 0, 50)], 150)
    assert pieces([100, 100, 100], 2, 1) == ([(1, 50, 100), (2, 0, 100)], 150)


def test_without_drop_last_the_last_rank_wraps_around_to_the_start_of_the_epoch():
    # 10 rows on 3 ranks: 4 each. Rank 2 takes rows 8 and 9, then rows 0 and 1 again.
    assert [pieces([5, 5], 3, r, drop_last=False) for r in range(3)] == [
        ([(0, 0, 4)], 4), ([(0, 4, 5), (1, 0, 3)], 4), ([(1, 3, 5), (0, 0, 2)], 4)]
    # With drop_last, 3 each: row 9 is left out.
    assert [pieces([5, 5], 3, r) for r in range(3)] == [
        ([(0, 0, 3)], 3), ([(0, 3, 5), (1, 0, 1)], 3), ([(1, 1, 4)], 3)]
    # More ranks than rows: with drop_last nobody takes any; without, every rank one, the last ones repeating.
    assert [pieces([2], 3, r) for r in range(3)] == [([], 0)] * 3
    assert [pieces([2], 3, r, drop_last=False) for r in range(3)] == [
        ([(0, 0, 1)], 1), ([(0, 1, 2)], 1), ([(0, 0, 1)], 1)]


def test_a_dataset_without_rows_or_with_an_empty_row_group():
    assert pieces([], 2, 0) == pieces([0, 0], 2, 1, drop_last=False) == ([], 0)
    assert pieces([1], 1, 0) == ([(0, 0, 1)], 1)
    # An empty row group (a file written from an empty partition) is stepped over: no empty piece.
    assert pieces([5, 0, 5], 1, 0) == ([(0, 0, 5), (2, 0, 5)], 10)
    assert pieces([5, 0, 5], 2, 1) == ([(2, 0, 5)], 5)


def test_the_shuffled_order_of_the_row_groups_is_fixed_by_seed_and_epoch():
    # The epoch order is part of a checkpoint's meaning (a state names batches of it): it must come out the same
    # on every rank, in every retry and in every later version. Seed 7, epoch 3: row groups 0, 3, 1, 2.
    sizes = [40, 25, 60, 11]  # 136 rows on 3 ranks: 46 each, rank 2 repeating the first 2 rows of the order
    assert [pieces(sizes, 3, r, shuffle=True, drop_last=False, seed=7, epoch=3) for r in range(3)] == [
        ([(0, 0, 40), (3, 0, 6)], 46),
        ([(3, 6, 11), (1, 0, 25), (2, 0, 16)], 46),
        ([(2, 16, 60), (0, 0, 2)], 46)]
    again = [pieces(sizes, 3, 1, shuffle=True, seed=7, epoch=3) for _ in range(2)]
    assert again[0] == again[1]
    orders = {tuple(g for g, _, _ in pieces(sizes, 1, 0, shuffle=True, seed=s, epoch=e)[0])
              for s, e in [(7, 3), (7, 4), (8, 3), (0, 0)]}
    assert len(orders) > 1 and all(sorted(o) == [0, 1, 2, 3] for o in orders)


@pytest.mark.parametrize("drop_last", [True, False])
def test_the_ranks_never_share_a_row_and_take_every_row_they_can(drop_last):
    rng = np.random.default_rng(1)
    for _ in range(50):
        sizes = rng.integers(0, 40, size=rng.integers(1, 9)).tolist()
        total, world = sum(sizes), int(rng.integers(1, 6))
        taken = []
        for rank in range(world):
            found, rows = pieces(sizes, world, rank, shuffle=True, drop_last=drop_last, seed=3, epoch=1)
            assert rows == sum(stop - start for _, start, stop in found) == rows_per_rank(total, world, drop_last)
            assert all(0 <= start < stop <= sizes[g] for g, start, stop in found)
            taken += rows_taken(found)
        if drop_last:
            assert len(set(taken)) == len(taken) == total // world * world
        else:  # every row, and the first few of the epoch order once more
            assert len(set(taken)) == total and len(taken) == -(-total // world) * world


def test_inside_a_row_group_its_blocks_come_in_an_order_of_their_own(monkeypatch):
    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 4)
    # 10 rows: blocks [0, 4), [4, 8), [8, 10). Seed 7, epoch 3, row group 2 takes them in the order 0, 2, 1.
    assert block_runs(7, 3, 2, 10, 0, 10, shuffle=True) == [(0, 4), (8, 10), (4, 8)]
    # Positions 3 to 8 of that order: the last row of block 0, the short block 2, half of block 1.
    assert block_runs(7, 3, 2, 10, 3, 8, shuffle=True) == [(3, 4), (8, 10), (4, 6)]
    # Two ranks splitting the row group between them take each row once.
    split = block_runs(7, 3, 2, 10, 0, 5, shuffle=True) + block_runs(7, 3, 2, 10, 5, 10, shuffle=True)
    assert sorted(i for first, end in split for i in range(first, end)) == list(range(10))
    # Another epoch or seed: another order of the same blocks. Without shuffle, the file order.
    assert block_runs(7, 4, 2, 10, 0, 10, True) == [(4, 8), (0, 4), (8, 10)]
    assert block_runs(8, 3, 2, 10, 0, 10, True) == [(8, 10), (0, 4), (4, 8)]
    assert block_runs(7, 3, 2, 10, 3, 8, shuffle=False) == [(3, 8)]


def test_the_shuffled_blocks_of_a_row_group_cover_it_at_any_split(monkeypatch):
    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    for rows in (1, 8, 9, 30, 64):
        for cut in range(rows + 1):
            runs = block_runs(5, 1, 0, rows, 0, cut, True) + block_runs(5, 1, 0, rows, cut, rows, True)
            assert sorted(i for first, end in runs for i in range(first, end)) == list(range(rows))
            assert all(first < end for first, end in runs)


def test_runs_merged_into_file_order():
    runs = [(1, 5, 8), (0, 0, 3), (1, 0, 5), (0, 4, 6), (2, 0, 1)]
    assert merged(runs) == [(0, 0, 3), (0, 4, 6), (1, 0, 8), (2, 0, 1)]
    assert merged([(0, 3, 6), (1, 6, 9)]) == [(0, 3, 6), (1, 6, 9)]  # adjacent positions of two row groups
    assert merged([]) == []


def test_windows_cut_into_batches_carry_over_only_their_own_rows():
    # Windows of 80, 160, 160 and 100 rows in batches of 24: 3 batches (8 rows carried over), 7 (none), 6 (16), then
    # 4 with drop_last (20 rows dropped) or 5 without (the last one partial).
    assert window_batches([80, 160, 160, 100], 24, True) == [(0, 72, 3), (8, 168, 7), (0, 144, 6), (16, 96, 4)]
    assert window_batches([80, 160, 160, 100], 24, False)[-1] == (16, 116, 5)
    rng = np.random.default_rng(1)
    for _ in range(100):  # windows of at least a batch (a loader's, but the last): a window's cut passes its carry
        bs = int(rng.integers(1, 30))
        rows = rng.integers(bs, 5 * bs, size=int(rng.integers(1, 6))).tolist()
        layout = window_batches(rows + [int(rng.integers(1, 2 * bs))], bs, bool(rng.integers(2)))
        assert all(cut >= bs > kept for kept, cut, _ in layout[:-1])
