"""spark_dist.data.read.loader_state: what a loader's ``state_dict`` holds, which states ``load_state_dict`` takes
back (and which it refuses, naming why), the windows a resumed iteration reads, and how a loader counts what it
yields. No JVM."""
import pytest
import torch

from spark_dist.data import DatasetError, make_loader
from spark_dist.data.read.loader_state import rows_of, windows_to_read
from test_loader import batches_equal, small_dataset  # noqa: F401 -- the fixture


def loader(handle, world_size=2, rank=0, **kwargs):
    kwargs = {"batch_size": 24, "seed": 2, **kwargs}
    return make_loader(handle, rank=rank, world_size=world_size, **kwargs)


def test_a_state_is_plain_values_naming_the_place_and_what_the_order_depends_on(small_dataset):
    two = loader(small_dataset, epoch=3)
    assert two.state_dict() == {"dataset": "small", "epoch": 3, "batches": 0, "seed": 2, "shuffle": True,
                                "num_rows": 1000, "world_size": 2, "batch_size": 24, "drop_last": True,
                                "epoch_batches": 20}
    batches = iter(two)
    next(batches), next(batches)
    assert two.state_dict()["batches"] == 2
    batches.close()
    list(two)  # the whole epoch: at its end
    assert (two.state_dict()["epoch"], two.state_dict()["batches"]) == (3, 20)
    two.set_epoch(4)  # the next epoch, not begun
    assert (two.state_dict()["epoch"], two.state_dict()["batches"]) == (4, 0)


def test_a_minimal_state_keeps_the_loaders_own_seed_and_shuffle(small_dataset):
    # Only the epoch and the batches yielded: everything else is the loader's.
    plain = loader(small_dataset, seed=5, shuffle=False)
    plain.load_state_dict({"epoch": 3, "batches": 2})
    assert (plain.epoch, plain.seed, plain.shuffle) == (3, 5, False)
    assert batches_equal(list(plain), list(loader(small_dataset, seed=5, shuffle=False, epoch=3))[2:])


def test_the_seed_and_shuffle_come_from_the_state(small_dataset):
    saved = loader(small_dataset, seed=9, shuffle=False, epoch=1)
    resumed = loader(small_dataset, seed=0, shuffle=True)
    resumed.load_state_dict({**saved.state_dict(), "batches": 4})
    assert (resumed.epoch, resumed.seed, resumed.shuffle) == (1, 9, False)
    assert batches_equal(list(resumed), list(saved)[4:])


def test_a_state_of_other_rows_is_refused_even_at_an_epochs_start(small_dataset):
    # Another dataset of the same name (rewritten since the checkpoint): its batches are other rows.
    state = {**loader(small_dataset).state_dict(), "num_rows": 900}
    with pytest.raises(DatasetError) as error:
        loader(small_dataset).load_state_dict(state)
    assert str(error.value) == (
        "dataset 'small': the loader state was saved with num_rows=900 (this loader: 1000) at batch 0 of an epoch; "
        "a place inside an epoch resumes only the same rows, batch size and drop_last (another batch size resumes "
        "at an epoch's start or end: save the checkpoint there to change it)")
    assert error.value.dataset == "small"


def test_a_state_past_the_epochs_end_or_not_a_loaders_is_refused(small_dataset):
    two = loader(small_dataset)
    with pytest.raises(DatasetError) as error:
        two.load_state_dict({**two.state_dict(), "batches": 21})
    assert str(error.value) == "dataset 'small': the loader state is at batch 21, outside the epoch's 20"
    assert error.value.dataset == "small"
    with pytest.raises(DatasetError) as error:
        two.load_state_dict({"batches": 3})
    assert str(error.value) == "dataset 'small': load_state_dict needs what state_dict() returned, got {'batches': 3}"
    assert error.value.dataset == "small"
    two.load_state_dict({**two.state_dict(), "batches": 20})  # the end itself: nothing left of the epoch
    assert list(two) == [] and two.state_dict()["batches"] == 20  # and a checkpoint there is still at the end


def test_a_dealt_state_saved_before_its_first_step_keeps_its_place(small_dataset):
    # 4 ranks took 3 steps (12 units); a checkpoint on 3 ranks right after resuming holds that place, and resuming it
    # on 2 ranks deals from there, exactly as the 4-rank state would.
    def ranks(world_size):
        return [loader(small_dataset, world_size, r, seed=5, epoch=2) for r in range(world_size)]

    four = ranks(4)
    state = {**four[0].state_dict(), "batches": 3}
    three = ranks(3)
    three[0].load_state_dict(state)
    saved = three[0].state_dict()
    assert saved == {**state, "world_size": 3, "batches": 0, "origin": {"world_size": 4, "position": 12},
                     "epoch_batches": 9}  # (40 - 12) // 3 steps, one unit left out
    from_saved, from_four = ranks(2), ranks(2)
    for a, b in zip(from_saved, from_four):
        a.load_state_dict(saved)
        b.load_state_dict(state)
    for a, b in zip(from_saved, from_four):
        assert a.state_dict() == {**saved, "world_size": 2, "epoch_batches": 14}
        assert batches_equal(list(a), list(b))


def test_a_rank_reloading_a_checkpoint_of_the_dealt_epoch_it_is_in(small_dataset):
    # Epoch 0, dealt out after 4 ranks took 3 steps; the 3-rank loader takes 2 steps, saves, and is restored.
    four_state = {**loader(small_dataset, 4, seed=5).state_dict(), "batches": 3}
    three = loader(small_dataset, 3, seed=5)
    three.load_state_dict(four_state)
    batches = iter(three)
    first = [next(batches), next(batches)]
    mid = three.state_dict()
    batches.close()
    assert mid["origin"] == {"world_size": 4, "position": 18} and mid["batches"] == 2
    three.load_state_dict(mid)
    rest = list(three)
    whole = loader(small_dataset, 3, seed=5)
    whole.load_state_dict(four_state)
    assert batches_equal(first + rest, list(whole))


def test_the_loader_counts_what_it_yields_and_reports_its_progress(small_dataset):
    two = loader(small_dataset, epoch=3)
    seen = []
    two.on_progress = lambda epoch, batches, total: seen.append((epoch, batches, total))
    two.load_state_dict({**two.state_dict(), "batches": 17})
    got = list(two)
    assert seen == [(3, 18, 20), (3, 19, 20), (3, 20, 20)]
    assert (two.batches, two.rows) == (3, 3 * 24) and len(got) == 3
    list(two)  # the whole epoch again: the totals add up over iterations
    assert (two.batches, two.rows, seen[-1]) == (23, 23 * 24, (3, 20, 20))


def test_the_rows_of_a_batch_are_the_length_of_its_first_sized_value():
    assert rows_of({"id": torch.arange(5), "text": ["a"] * 5}) == 5
    # A collate may put a number (or a 0-d tensor) first: it has no length, the next value tells.
    assert rows_of({"weight": 0.5, "scale": torch.tensor(2.0), "x": torch.zeros(4, 3)}) == 4
    assert rows_of((torch.zeros(6, 2), torch.zeros(6))) == rows_of([torch.zeros(6, 2)]) == 6
    assert rows_of(torch.zeros(7, 2)) == 7  # a transform that returns one tensor
    assert rows_of({"loss_scale": 1.0}) == rows_of(3) == rows_of({}) == 0


def test_windows_read_to_make_a_stretch_of_batches():
    # Windows of 80, 160, 160 and 100 rows in batches of 24 with drop_last: 3 batches (8 rows carried over), 7 (none
    # carried), 6 (16 carried), then 4 (20 rows dropped): batches 0-2, 3-9, 10-15, 16-19.
    rows = [80, 160, 160, 100]
    assert windows_to_read(rows, 24, True, 0) == [(0, 0, 0), (1, 0, 8), (2, 0, 0), (3, 0, 16)]
    assert windows_to_read(rows, 24, True, 0, stop=2) == windows_to_read(rows, 24, True, 0, stop=3) == [(0, 0, 0)]
    # Batches 5 to 8 are in window 1, which takes 8 rows of window 0 over: window 0 is read, its 3 batches not
    # yielded, then 2 of window 1's.
    assert windows_to_read(rows, 24, True, 5, stop=9) == [(0, 3, 0), (1, 2, 8)]
    assert windows_to_read(rows, 24, True, 10) == [(2, 0, 0), (3, 0, 16)]  # window 2 takes nothing over
    assert windows_to_read(rows, 24, True, 17) == [(2, 6, 0), (3, 1, 16)]
    assert windows_to_read(rows, 24, True, 20) == []
    # 50-row windows, no drop_last: every window carries rows into the next, but only rows of its own, so the
    # last batch needs windows 1 (after a placeholder of the 2 rows it took over) and 2, not window 0.
    assert windows_to_read([50, 50, 50], 24, False, 2, stop=4) == [(0, 2, 0), (1, 0, 2)]
    assert windows_to_read([50, 50, 50], 24, False, 6) == [(1, 2, 2), (2, 2, 4)]
    # Windows smaller than a batch carry over rows they took over too: back to the window those come from.
    assert windows_to_read([10, 10, 30], 24, True, 0) == [(0, 0, 0), (1, 0, 10), (2, 0, 20)]


@pytest.fixture
def many_windows(tmp_path, monkeypatch):
    """3,000 rows (an id, a text) in row groups of 50, blocks of 8 rows: a rank's epoch is many shuffle windows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dist.data.handle import describe_files
    from spark_dist.data.read import epoch_order

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    path = tmp_path / "part-0.parquet"
    ids = np.arange(3000)
    pq.write_table(pa.table({"id": ids, "text": pa.array([f"t{i}" for i in ids])}), path, row_group_size=50)
    return describe_files("many", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar", "text": "string"}, {})


def noisy(batch):
    """A transform drawing from its batch's seeded generator: a resumed batch draws what it drew uninterrupted."""
    return {**batch, "noise": torch.rand(3)}


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("window, batch_size", [(100, 24), (70, 16), (150, 32), (45, 7)])
def test_a_resume_reads_no_window_before_the_one_its_place_takes_rows_from(many_windows, monkeypatch, shuffle,
                                                                            drop_last, window, batch_size):
    # Windows of `window` rows (a quarter and a half of that first), not a multiple of the batch size: almost every
    # window takes rows over from the one before. Resuming near the epoch's end or in its middle reads the window of
    # the resume point, the one before it (for the rows it carries over) and those after; nothing earlier is
    # decoded or gathered, and the batches (their rows, order and transform's draws) are the uninterrupted ones.
    from spark_dist.data.read import loader as loader_module
    from spark_dist.data.read.epoch_order import window_batches
    from spark_dist.data.read.variable_size import row_bytes

    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", window * (8 + row_bytes([many_windows.column("text")])))

    def loader(**kwargs):
        return make_loader(many_windows, rank=1, world_size=2, batch_size=batch_size, seed=4, epoch=2,
                           shuffle=shuffle, drop_last=drop_last, **kwargs)

    whole, transformed = list(loader()), list(loader(transform=noisy))
    plan = list(loader()._window_runs())
    own = [sum(end - first for _, first, end in runs) for runs in plan]
    layout = window_batches(own, batch_size, drop_last)
    assert len(plan) > 10 and sum(1 for kept, _, _ in layout if kept) > len(plan) // 2
    gathered, decoded = [0], [0]
    real_gather, real_decode = loader_module.ShardLoader._gather, loader_module.ShardLoader._decode

    def counting_gather(self, decoded_groups, runs, carry, index):
        rows = real_gather(self, decoded_groups, runs, carry, index)
        gathered[0] += len(next(iter(rows.values())))
        return rows

    def counting_decode(self, group):
        starts, chunks = real_decode(self, group)
        decoded[0] += int(starts[-1])
        return starts, chunks

    monkeypatch.setattr(loader_module.ShardLoader, "_gather", counting_gather)
    monkeypatch.setattr(loader_module.ShardLoader, "_decode", counting_decode)
    for k in (len(whole) - 2, len(whole) // 2):
        at = max(w for w in range(len(layout)) if sum(c for _, _, c in layout[:w]) <= k)  # the window of batch k
        read = range(at - 1 if layout[at][0] else at, len(plan))
        # The rows of each window read (those it took over, then its own), and the rows of their row groups.
        expected_rows = (sum(layout[w][0] + own[w] for w in read), 50 * len({g for w in read for g, _, _ in plan[w]}))
        for kwargs, expected in (({}, whole), ({"transform": noisy}, transformed)):
            resumed = loader(**kwargs)
            resumed.load_state_dict({**resumed.state_dict(), "batches": k})
            gathered[0] = decoded[0] = 0
            assert batches_equal(list(resumed), expected[k:])
            assert (gathered[0], decoded[0]) == expected_rows, (
                f"resume at batch {k} of {len(whole)} (window {at} of {len(plan)}): gathered {gathered[0]} rows and "
                f"decoded {decoded[0]}, expected {expected_rows}, of the rank's {sum(own)}")
