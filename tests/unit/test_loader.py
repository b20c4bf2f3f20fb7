"""spark_dist.data.read.loader on Parquet files written with pyarrow: each rank's equal shard, the epoch order, and
what a rank decodes and imports. No JVM."""
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spark_dist.data import make_loader
from spark_dist.data.handle import ColumnStats, describe_files
from spark_dist.data.read.loader import shard_pieces


def rank_batches(handle, world_size, **kwargs):
    """What each rank would iterate: a list of batches per rank."""
    kwargs.setdefault("batch_size", 16)
    return [list(make_loader(handle, rank=r, world_size=world_size, **kwargs)) for r in range(world_size)]


def ids_of(batches):
    return [i for b in batches for i in b["id"].tolist()]


def test_petastorm_uneven_row_groups_are_split_exactly(tmp_path):
    # Petastorm shards 10 row groups of 100 rows round robin over 3 shards: 400 / 300 / 300 rows, and DDP hangs.
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": np.arange(1000)}), path, row_group_size=100)
    handle = describe_files("ten_groups", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar"}, {})
    assert handle.row_group_rows == ((100,) * 10,)

    for r in range(3):
        pieces, rows = shard_pieces([100] * 10, world_size=3, rank=r, epoch=0, seed=0, shuffle=True,
                                    drop_last=True)
        assert rows == sum(stop - start for _, start, stop in pieces) == 333
    per_rank = rank_batches(handle, 3, batch_size=50)
    assert [len(b) for b in per_rank] == [6, 6, 6]
    everything = [i for batches in per_rank for i in ids_of(batches)]
    assert len(everything) == len(set(everything)) == 900


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_windows_chunks_and_blocks_smaller_than_the_data(tmp_path, monkeypatch, shuffle, drop_last):
    # Real caches have row groups of ~8 MiB; shrink the loader's units so that 2,000 rows cross them all:
    # blocks of 8 rows, decoded chunks of 24, shuffle windows of ~100 rows, row groups of 70 / 130 rows.
    from spark_dist.data.read import epoch_order, loader as loader_module

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_READ_CHUNK_ROWS", 24)
    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", 100 * (8 + 3 * 4))
    ids = np.arange(2000)
    vec = pa.ListArray.from_arrays(np.arange(0, 3 * 2000 + 1, 3, dtype=np.int32),
                                   pa.array(np.repeat(ids, 3).astype(np.float32)))
    urls = []
    for f, (lo, hi, group) in enumerate([(0, 700, 70), (700, 2000, 130)]):
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"id": ids[lo:hi], "vec": vec[lo:hi]}), path, row_group_size=group)
        urls.append(f"file://{path}")
    handle = describe_files("small", f"file://{tmp_path}", urls, {"id": "scalar", "vec": "vector"},
                            {"vec": ColumnStats(length=3)})

    per_rank = rank_batches(handle, 3, batch_size=32, shuffle=shuffle, drop_last=drop_last, seed=3, epoch=2)
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == (20 if drop_last else 21)
    for batches in per_rank:
        for b in batches:
            assert torch.equal(b["vec"], b["id"].float()[:, None].expand(-1, 3))   # rows stay whole
    seen = [i for batches in per_rank for i in ids_of(batches)]
    if drop_last:
        assert len(seen) == len(set(seen)) == 1920
    else:
        assert set(seen) == set(range(2000)) and len(seen) == 2001
    if not shuffle:
        assert ids_of(per_rank[0])[:100] == list(range(100))
    assert per_rank[1][3]["id"].tolist() == rank_batches(
        handle, 3, batch_size=32, shuffle=shuffle, drop_last=drop_last, seed=3, epoch=2)[1][3]["id"].tolist()


def test_a_rank_decodes_each_row_group_once_and_holds_few_at_a_time(tmp_path, monkeypatch):
    # Memory per rank is bounded by the window and the row groups decoded for it (plus _DECODE_AHEAD ahead), not
    # by the dataset: 40 row groups of 50 rows, windows of ~100 rows.
    import weakref

    from spark_dist.data.read import epoch_order, loader as loader_module

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", 100 * 8)
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": np.arange(2000)}), path, row_group_size=50)
    handle = describe_files("many groups", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar"}, {})
    held, decoded, most_held = [], [], [0]  # a weak reference to each decoded row group's first chunk
    real_decode = loader_module.ShardLoader._decode

    def counting_decode(self, group):
        starts, chunks = real_decode(self, group)
        decoded.append(group)
        held.append(weakref.ref(chunks["id"][0]))
        most_held[0] = max(most_held[0], sum(ref() is not None for ref in held))
        return starts, chunks

    monkeypatch.setattr(loader_module.ShardLoader, "_decode", counting_decode)
    seen = []
    for batch in make_loader(handle, rank=0, world_size=1, batch_size=10, seed=1):
        seen += batch["id"].tolist()
        time.sleep(0.002)  # a slow training step: the decode thread runs ahead as far as it may
    assert sorted(seen) == list(range(2000))
    assert sorted(decoded) == list(range(40))  # each row group decoded once in the epoch
    # A window spans at most 3 row groups here, and _DECODE_AHEAD more are decoded ahead (4: of 40).
    assert most_held[0] <= 3 + loader_module._DECODE_AHEAD


def test_a_read_error_reaches_the_training_loop(tmp_path):
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": np.arange(100)}), path)
    handle = describe_files("gone", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar"}, {})
    loader = make_loader(handle, rank=0, world_size=1, batch_size=10)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        list(loader)


@pytest.mark.parametrize("array", [
    pa.array(np.arange(50, dtype=np.int64)).slice(7, 30),
    pa.array(np.linspace(0, 1, 50, dtype=np.float32)).slice(3),
    pa.array([1.5, None, 2.5]),                              # nulls: pyarrow's own conversion
    pa.array([True, False, True] * 5).slice(1, 9),           # bits, not a values buffer
], ids=["int64 sliced", "float32 sliced", "with nulls", "bool"])
def test_a_ranks_numpy_views_match_pyarrows_conversion(array):
    from spark_dist.data.read.arrays import list_values as _list_values, to_numpy as _to_numpy

    np.testing.assert_array_equal(_to_numpy(array), array.to_numpy(zero_copy_only=False))
    lists = pa.ListArray.from_arrays(pa.array(range(0, len(array) + 1, 1), pa.int32()), array).slice(2)
    np.testing.assert_array_equal(_list_values(lists), lists.flatten().to_numpy(zero_copy_only=False))


def test_a_ranks_first_epoch_imports_neither_pandas_nor_pyarrow_compute(tmp_path):
    # A rank is a fresh process: pyarrow's to_numpy imports pandas on its first call and flatten()
    # pyarrow.compute, and the first batch of every training run would wait for both.
    import subprocess
    import sys

    import pickle

    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"x": pa.array([[float(i), -float(i)] for i in range(100)], pa.list_(pa.float32())),
                             "label": np.arange(100)}), path)
    handle = describe_files("d", f"file://{tmp_path}", [f"file://{path}"], {"x": "array", "label": "scalar"},
                            {"x": ColumnStats(length=2)})
    (tmp_path / "handle.pkl").write_bytes(pickle.dumps(handle))  # as a rank gets it
    code = f"""if True:
        import pickle, sys
        from spark_dist.data import make_loader
        handle = pickle.load(open("{tmp_path / 'handle.pkl'}", "rb"))
        batch = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=10)))
        assert batch["x"].shape == (10, 2) and (batch["x"][:, 0] == batch["label"]).all(), batch
        print(sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]"]


# -- epochs under Lightning, and a resume mid-epoch ---------------------------------------------------------------
@pytest.fixture
def small_dataset(tmp_path, monkeypatch):
    """1,000 rows in row groups of 90, blocks of 8 rows, shuffle windows of 40, 80 then ~160 rows (rows carried over
    from one window to the next at batch size 24)."""
    from spark_dist.data.read import epoch_order, loader as loader_module

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_WINDOW_BYTES", 160 * (8 + 8))
    path = tmp_path / "part-0.parquet"
    ids = np.arange(1000)
    pq.write_table(pa.table({"id": ids, "text": pa.array([f"t{i}" for i in ids])}), path, row_group_size=90)
    return describe_files("small", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar", "text": "string"}, {})


def test_lightning_sets_each_epochs_order_through_the_loaders_sampler(small_dataset):
    lightning = pytest.importorskip("lightning.pytorch")

    class Recorder(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = {}

        def training_step(self, batch, index):
            assert batch["text"] == [f"t{i}" for i in batch["id"].tolist()]
            self.seen.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
            return self.layer(batch["id"].float()[:, None]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    loader = make_loader(small_dataset, rank=1, world_size=2, batch_size=24, seed=5)
    model = Recorder()
    trainer = lightning.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    expected = {e: ids_of(make_loader(small_dataset, rank=1, world_size=2, batch_size=24, seed=5, epoch=e))
                for e in range(3)}
    assert model.seen == expected
    assert expected[0] != expected[1] != expected[2] != expected[0]


def test_lightning_checkpoints_keep_the_loaders_place_and_resume_there(small_dataset, tmp_path):
    # The loader has state_dict / load_state_dict: Lightning saves its state in a checkpoint taken mid-epoch and
    # restores it, so a resumed fit sees the rest of that epoch, then the next, batch for batch.
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Recorder(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = []

        def training_step(self, batch, index):
            self.seen.append((self.current_epoch, batch["id"].tolist()))
            return self.layer(batch["id"].float()[:, None]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(callbacks=(), **kwargs):
        model = Recorder()
        trainer = lightning.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, callbacks=list(callbacks),
                                    enable_checkpointing=bool(callbacks), enable_progress_bar=False,
                                    enable_model_summary=False)
        trainer.fit(model, make_loader(small_dataset, rank=0, world_size=1, batch_size=24, seed=3), **kwargs)
        return model.seen

    whole = fit([ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1, filename="{step}")])
    assert len(whole) == 2 * 41
    saved = torch.load(tmp_path / "ckpt" / "step=7.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]
    assert saved["combined_loader"][0]["batches"] == 7
    assert fit(ckpt_path=str(tmp_path / "ckpt" / "step=7.ckpt")) == whole[7:]


def batches_equal(got, expected):
    return len(got) == len(expected) and all(
        g.keys() == e.keys() and all(torch.equal(g[c], e[c]) if isinstance(e[c], torch.Tensor) else g[c] == e[c]
                                     for c in e) for g, e in zip(got, expected))


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_state_taken_mid_epoch_resumes_at_the_exact_next_batch(small_dataset, monkeypatch, drop_last):
    from spark_dist.data.read import loader as loader_module

    def loader(**kwargs):
        return make_loader(small_dataset, rank=0, world_size=2, batch_size=24, seed=2, drop_last=drop_last, **kwargs)

    epoch2, epoch3 = list(loader(epoch=2)), list(loader(epoch=3))
    assert len(epoch2) == (20 if drop_last else 21)
    decoded = []
    real_decode = loader_module.ShardLoader._decode
    monkeypatch.setattr(loader_module.ShardLoader, "_decode",
                        lambda self, group: decoded.append(group) or real_decode(self, group))
    for k in (0, 1, 5, 9, 13, len(epoch2) - 1, len(epoch2)):
        interrupted = loader(epoch=0)
        interrupted.set_epoch(2)
        batches = iter(interrupted)
        got = [next(batches) for _ in range(k)]
        state = interrupted.state_dict()
        batches.close()  # the training loop stops here: the rank is killed
        assert (state["epoch"], state["batches"], state["seed"]) == (2, k, 2)
        assert batches_equal(got, epoch2[:k])

        resumed = loader()  # a fresh loader (a restarted rank), at epoch 0 until the state says otherwise
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        decoded.clear()
        assert batches_equal(list(resumed), epoch2[k:])
        if k == len(epoch2):
            assert decoded == []  # nothing left to yield: nothing read
        resumed.set_epoch(3)
        assert batches_equal(list(resumed), epoch3)  # the next epoch as usual, whole


def test_a_restored_position_outlives_setting_its_own_epoch_only(small_dataset):
    def loader(**kwargs):
        return make_loader(small_dataset, rank=1, world_size=2, batch_size=24, seed=2, **kwargs)

    state = {**loader(epoch=4).state_dict(), "batches": 7}
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(4)  # what Lightning does after restoring a checkpoint: the position stays
    assert len(list(resumed)) == len(resumed) - 7
    assert len(list(resumed)) == len(resumed)  # iterating again replays the whole epoch
    resumed.load_state_dict(state)
    resumed.set_epoch(5)  # another epoch: the position is dropped
    assert batches_equal(list(resumed), list(loader(epoch=5)))


def test_a_state_of_other_sharding_is_refused(small_dataset):
    from spark_dist.data import DatasetError

    state = {**make_loader(small_dataset, rank=0, world_size=2, batch_size=24).state_dict(), "batches": 3}
    with pytest.raises(DatasetError, match=r"world_size=2 \(this loader: 4\), batch_size=24 \(this loader: 16\) at "
                                           "batch 3 of an epoch"):
        make_loader(small_dataset, rank=0, world_size=4, batch_size=16).load_state_dict(state)
    with pytest.raises(DatasetError, match="needs what state_dict"):
        make_loader(small_dataset, rank=0, world_size=2, batch_size=24).load_state_dict({"epoch": 1})
    other_rank = make_loader(small_dataset, rank=1, world_size=2, batch_size=24)
    other_rank.load_state_dict({**state, "epoch": 3, "batches": 2, "seed": 8})  # rank 0's state serves every rank
    assert (other_rank.epoch, other_rank.seed, len(list(other_rank))) == (3, 8, len(other_rank) - 2)


def test_a_state_of_another_batch_size_resumes_at_an_epoch_boundary_only(small_dataset):
    from spark_dist.data import DatasetError

    def loader(world_size, batch_size=16, **kwargs):
        return make_loader(small_dataset, rank=0, world_size=world_size, batch_size=batch_size, seed=3, **kwargs)

    two = loader(2, epoch=4)
    at_end = {**two.state_dict(), "batches": len(two)}  # what a checkpoint after the epoch's last batch holds
    one = loader(1, batch_size=32)  # the same global batch on 1 rank
    one.load_state_dict(at_end)  # a resharded run (2 ranks, now 1) goes on with the next epoch, whole
    assert list(one) == []
    one.set_epoch(5)
    assert batches_equal(list(one), list(loader(1, batch_size=32, epoch=5)))
    one = loader(1)
    one.load_state_dict({**at_end, "batches": 0})
    assert batches_equal(list(one), list(loader(1, epoch=4)))
    with pytest.raises(DatasetError, match="batch_size=16 .* at batch 3 .*another batch size resumes at an "
                                           "epoch's start or end"):
        loader(1, batch_size=32).load_state_dict({**at_end, "batches": 3})


def test_windows_to_read_are_those_the_batches_from_the_resume_point_need():
    from spark_dist.data.read.epoch_order import window_batches
    from spark_dist.data.read.loader_state import windows_to_read

    def replayed(rows, bs, drop_last, todo):
        """The batches of the windows read, as the loader makes them: each window's own rows (labelled) in a shuffle
        of their own, after the rows the window before carried over, or a placeholder of as many ("?")."""
        carry, out, last = ["?"] * (todo[0][2] if todo else 0), [], len(rows) - 1
        for index, skipped, carried_in in todo:
            assert len(carry) == carried_in
            window = carry + [(index, i) for i in np.random.default_rng(index).permutation(rows[index])]
            cut = len(window) if index == last and not drop_last else len(window) // bs * bs
            out += [window[s:s + bs] for s in range(0, cut, bs)][skipped:]
            carry = window[cut:]
        return out

    rng = np.random.default_rng(0)
    for _ in range(300):
        rows = rng.integers(1, 60, size=rng.integers(1, 8)).tolist()
        bs, drop_last = int(rng.integers(1, 20)), bool(rng.integers(2))
        layout = window_batches(rows, bs, drop_last)
        total = sum(count for _, _, count in layout)
        whole = replayed(rows, bs, drop_last, windows_to_read(rows, bs, drop_last, 0))
        assert len(whole) == total
        if total:  # from the start: every window, as before resuming existed
            assert windows_to_read(rows, bs, drop_last, 0) == [(i, 0, kept) for i, (kept, _, _) in enumerate(layout)]
        for skip in range(total + 1):
            for stop in sorted({total, min(total, skip + int(rng.integers(1, 4)))}):
                todo = windows_to_read(rows, bs, drop_last, skip, stop)
                if todo:
                    assert [i for i, _, _ in todo] == list(range(todo[0][0], todo[-1][0] + 1))
                # The batches from `skip` on are those of the whole epoch, none holding a placeholder's row.
                assert replayed(rows, bs, drop_last, todo)[:stop - skip] == whole[skip:stop]
                if todo and min(rows[:-1], default=bs) >= bs:  # a loader's windows: one before batch skip's at most
                    at = max(w for w in range(len(layout)) if sum(c for _, _, c in layout[:w]) <= skip)
                    assert todo[0][0] >= at - 1


def test_the_data_modules_import_no_cycle_not_even_inside_functions():
    # test_layout checks cycles at module level; here an import inside a function counts too, so no module of the
    # data package waits for another that waits for it (the loader's helpers are handed what they need instead).
    from test_layout import ALL, imports

    data = {m: p for m, p in ALL.items() if m.startswith("spark_dist.data.")}
    graph = {m: {i for i, _ in imports(m, p) if i in data and i != m} for m, p in data.items()}
    cycles = []

    def visit(module, trail):
        for nxt in sorted(graph[module]):
            if nxt in trail:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in seen:
                seen.add(nxt)
                visit(nxt, trail + [nxt])

    seen = set()
    for module in sorted(graph):
        if module not in seen:
            seen.add(module)
            visit(module, [module])
    assert not cycles, cycles
