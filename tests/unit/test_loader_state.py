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
    assert windows_to_read(rows, 24, True, 0) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert windows_to_read(rows, 24, True, 0, stop=2) == windows_to_read(rows, 24, True, 0, stop=3) == [(0, 0)]
    # Batches 5 to 8 are in window 1, which takes 8 rows of window 0 over: window 0 is read, its 3 batches not
    # yielded, then 2 of window 1's.
    assert windows_to_read(rows, 24, True, 5, stop=9) == [(0, 3), (1, 2)]
    assert windows_to_read(rows, 24, True, 10) == [(2, 0), (3, 0)]  # window 2 takes nothing over
    assert windows_to_read(rows, 24, True, 17) == [(2, 6), (3, 1)]
    assert windows_to_read(rows, 24, True, 20) == []
    # 50-row windows, no drop_last: every window carries rows into the next, so the last batch needs them all.
    assert windows_to_read([50, 50, 50], 24, False, 2, stop=4) == [(0, 2), (1, 0)]
    assert windows_to_read([50, 50, 50], 24, False, 6) == [(0, 2), (1, 2), (2, 2)]
