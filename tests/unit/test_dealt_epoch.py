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


def test_a_rank_after_losing_one_of_32_gathers_only_the_rows_it_yields_with_one_reader(thirty_two_ranks,
                                                                                      monkeypatch):
    import threading

    import numpy as np

    from spark_dist.data.read import dealt_epoch, loader as loader_module
    from spark_dist.data.read.epoch_order import window_batches

    def loader(rank, world_size):
        return make_loader(thirty_two_ranks, rank=rank, world_size=world_size, batch_size=4, seed=5, epoch=1)

    uninterrupted = [list(loader(r, 32)) for r in range(32)]
    assert {len(u) for u in uninterrupted} == {24}
    state = {**loader(0, 32).state_dict(), "batches": 1}  # every rank took one step, then one rank was lost
    sizes = [sum(end - first for _, first, end in runs) for runs in loader(0, 32)._window_runs()]
    firsts = np.cumsum([0] + [count for _, _, count in window_batches(sizes, 4, drop_last=True)])

    def window_of(batch):
        return int(np.searchsorted(firsts, batch, side="right")) - 1

    # What reading costs: the rows copied into windows or batches (a window's gather, or the dealt epoch's), and
    # the row groups decoded.
    gathered, decoded = [0], []
    real_gather, real_decode = loader_module.ShardLoader._gather, loader_module.ShardLoader._decode

    def window_gather(self, decoded_groups, runs, carry, window):
        rows = real_gather(self, decoded_groups, runs, carry, window)
        gathered[0] += len(next(iter(rows.values())))
        return rows

    monkeypatch.setattr(loader_module.ShardLoader, "_gather", window_gather)
    monkeypatch.setattr(loader_module.ShardLoader, "_decode",
                        lambda self, group: decoded.append(group) or real_decode(self, group))
    real_rows = dealt_epoch.gather_rows
    monkeypatch.setattr(dealt_epoch, "gather_rows", lambda loader, out, found, decoded_groups: (
        gathered.__setitem__(0, gathered[0] + len(found[0])) or real_rows(loader, out, found, decoded_groups)))
    for rank in (0, 17, 30):
        dealt = loader(rank, 31)
        dealt.load_state_dict(state)
        gathered[0], most_threads, got = 0, 0, []
        del decoded[:]
        before = threading.active_count()
        for batch in dealt:
            most_threads = max(most_threads, threading.active_count())
            got.append(batch)
        units = my_units(32 * 24, 32, 31, rank, drop_last=True)
        assert batches_equal(got, [uninterrupted[q % 32][q // 32] for q in units])
        # Every row it gathers it yields: a batch's rows are picked out of its window by the window's shuffle,
        # not by gathering the window (nor the windows before it that carry rows into it).
        assert gathered[0] == len(ids(got)) == 4 * len(got)
        # It decodes only row groups that hold rows it yields (the fixture's row group of a row is its id // 90),
        # each once for each window index whose batches take rows from it (the batches of a window index are
        # made together; every old rank's windows yield the same batch numbers).
        assert set(decoded) == {i // 90 for i in ids(got)}
        assert len(decoded) == len({(window_of(q // 32), i // 90) for q, batch in zip(units, got)
                                    for i in batch["id"].tolist()})
        # One reader: its thread and its two decoding threads, as an uninterrupted loader; gone at the end.
        assert most_threads <= before + 3
        assert threading.active_count() == before


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_every_dealt_batch_is_the_one_its_old_rank_yields_whatever_the_columns_and_order(tmp_path, monkeypatch,
                                                                                         shuffle, drop_last):
    # A number, a vector (cast to float64) and a string column; windows of 10, 20 then 40 rows in batches of 6
    # (rows carried over), row groups of 70 in two files; 5 ranks shrunk to 3 or to 1 (more batches of a window
    # index than a part holds), and 3 grown to 4, after 2 steps.
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dist.data.handle import ColumnStats, describe_files
    from spark_dist.data.read import epoch_order, loader as loader_module, variable_size

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_READ_CHUNK_ROWS", 16)
    ids = np.arange(1003)
    vec = pa.ListArray.from_arrays(np.arange(0, 2 * 1003 + 1, 2, dtype=np.int32),
                                   pa.array(np.repeat(ids, 2).astype(np.float32)))
    table = pa.table({"id": ids, "vec": vec, "text": pa.array([f"t{i}" for i in ids])})
    urls = []
    for f, (lo, hi) in enumerate([(0, 400), (400, 1003)]):
        pq.write_table(table.slice(lo, hi - lo), tmp_path / f"part-{f}.parquet", row_group_size=70)
        urls.append(f"file://{tmp_path}/part-{f}.parquet")
    handle = describe_files("mixed", f"file://{tmp_path}", urls, {"id": "scalar", "vec": "vector", "text": "string"},
                            {"vec": ColumnStats(length=2)})
    row_bytes = 8 + 2 * 4 + variable_size.row_bytes([handle.column("text")])
    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", 40 * row_bytes)

    def loader(rank, world_size):
        return make_loader(handle, rank=rank, world_size=world_size, batch_size=6, seed=4, epoch=3, shuffle=shuffle,
                           drop_last=drop_last, dtypes={"vec": torch.float64})

    assert [sum(e - f for _, f, e in runs) for runs in loader(0, 5)._window_runs()][:4] == [10, 20, 40, 40]
    for old, new in ((5, 3), (5, 1), (3, 4)):
        uninterrupted = [list(loader(r, old)) for r in range(old)]
        state = {**loader(0, old).state_dict(), "batches": 2}
        units = old * len(uninterrupted[0])
        for rank in range(new):
            dealt = loader(rank, new)
            dealt.load_state_dict(state)
            got = list(dealt)
            expected = [uninterrupted[q % old][q // old] for q in my_units(units, 2 * old, new, rank, drop_last)]
            assert batches_equal(got, expected) and len(got) == steps(units, 2 * old, new, drop_last)
            for batch in got:
                assert batch["text"] == [f"t{i}" for i in batch["id"].tolist()]
                assert torch.equal(batch["vec"], batch["id"].double()[:, None].expand(-1, 2))


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


def test_where_each_dealt_unit_comes_from_and_the_parts_made_at_once():
    from spark_dist.data.read.dealt_epoch import epoch_units, origins, parts

    # 1,000 rows on 4 ranks in batches of 24: 10 batches each with drop_last (250 rows), else 11: 40 or 44 units.
    assert (epoch_units(1000, 4, 24, True), epoch_units(1000, 4, 24, False)) == (40, 44)
    # After 3 steps of 4 ranks (12 units), new rank 0 of 3 takes units 12, 15, 18, ...: batch 3 of old rank 0,
    # batch 3 of old rank 3, batch 4 of old rank 2, ...
    assert origins(40, 12, 4, 3, 0, True)[:4] == [(0, 3), (3, 3), (2, 4), (1, 5)]
    # A part is made at once: units whose batches one window index yields (windows of batches 0-1, 2-4 and 5 on,
    # the same for every old rank), at most `hold` of them; a wrap to the start of what was left starts another.
    where = [(2, 3), (3, 3), (0, 4), (1, 4), (2, 4), (3, 6), (0, 7), (1, 2)]
    assert parts(where, [0, 2, 5], hold=3) == [[(2, 3), (3, 3), (0, 4)], [(1, 4), (2, 4)], [(3, 6), (0, 7)],
                                               [(1, 2)]]
    assert parts([], [0, 2, 5], hold=3) == []
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


def test_shrunk_then_grown_back_off_a_step_boundary_each_rank_reads_one_old_rank(small_dataset, monkeypatch):
    # 4 ranks take 3 steps (12 units), 2 ranks take one more (14): 4 ranks again go on from unit 14, where each
    # rank's units are consecutive batches of one old rank, read through that rank's loader alone.
    from spark_dist.data.read import loader as loader_module
    from spark_dist.data.read.dealt_epoch import places

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
    assert [places(loader, 4, 14) for loader in regrown] == [
        [(old, b) for b in range(first, first + 6)] for old, first in [(2, 3), (3, 3), (0, 4), (1, 4)]
    ]  # 6 steps each; units 38 and 39 left out
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


def test_a_dealt_epochs_batches_with_where_each_belongs_and_the_reading_times(small_dataset, monkeypatch):
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
    # One loader of each old rank it takes from tells where that rank's rows are; the waiting and the reading
    # add up in the loader the training loop holds.
    assert len(readers) == 2 and two.wait_seconds > 0 and two.read_seconds > 0
    assert [(r.wait_seconds, r.read_seconds) for r in readers] == [(0, 0), (0, 0)]


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
