"""spark_dist.data.loader on Parquet files written with pyarrow: each rank's equal shard, the epoch order, and what a
rank decodes and imports. No JVM."""
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spark_dist.data import make_loader
from spark_dist.data.handle import ColumnStats, describe_files
from spark_dist.data.loader import shard_pieces


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
    from spark_dist.data import epoch_order, loader as loader_module

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

    from spark_dist.data import epoch_order, loader as loader_module

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
    from spark_dist.data.arrays import list_values as _list_values, to_numpy as _to_numpy

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
