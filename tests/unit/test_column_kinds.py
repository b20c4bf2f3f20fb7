"""spark_dist.data's loader on every column kind, from Parquet files written with pyarrow (as the cache holds them):
binary and string as lists, variable-length arrays padded or ragged, nested and shaped arrays as N-d tensors, all
in the same rows as the numbers of the batch. No JVM."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from spark_dist.data import DatasetError, make_loader
from spark_dist.data.handle import ColumnStats, describe_files

N = 600
KINDS = {"id": "scalar", "img": "binary", "text": "string", "tokens": "sequence", "grid": "nested",
         "pixels": "array"}


def image(i):
    return bytes([i % 256, (i * 7) % 256]) * (i % 5 + 1)


def tokens(i):
    return list(range(i, i + i % 6))  # 0 to 5 values, some rows empty


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    """Two files of row groups of 70 / 130 rows, every kind of column, each value derived from the row's id."""
    tmp = tmp_path_factory.mktemp("kinds")
    ids = np.arange(N)
    table = pa.table({
        "id": ids,
        "img": pa.array([image(i) for i in range(N)], pa.binary()),
        "text": pa.array([f"row {i}" for i in range(N)]),
        "tokens": pa.array([tokens(i) for i in range(N)], pa.list_(pa.int64())),
        "grid": pa.array([[[float(i), -float(i), 0.5]] * 2 for i in range(N)], pa.list_(pa.list_(pa.float32()))),
        "pixels": pa.array([[float(i)] * 12 for i in range(N)], pa.list_(pa.float32())),
    })
    urls = []
    for f, (lo, hi, group) in enumerate([(0, 250, 70), (250, N, 130)]):
        path = tmp / f"part-{f}.parquet"
        pq.write_table(table.slice(lo, hi - lo), path, row_group_size=group, compression="none",
                       use_dictionary=False)
        urls.append(f"file://{path}")
    return describe_files("kinds", f"file://{tmp}", urls, KINDS,
                          {"tokens": ColumnStats(length_range=(0, 5)), "grid": ColumnStats(length=6, shape=(2, 3)),
                           "pixels": ColumnStats(length=12)})


@pytest.fixture
def small_units(monkeypatch):
    """The loader's units shrunk so that 600 rows cross them all: blocks of 8 rows, decoded chunks of 24."""
    from spark_dist.data.read import epoch_order, loader as loader_module

    monkeypatch.setattr(epoch_order, "BLOCK_ROWS", 8)
    monkeypatch.setattr(loader_module, "_READ_CHUNK_ROWS", 24)


def check_rows(batch, ragged=False):
    """Every column of ``batch`` holds the rows its ``id`` says."""
    ids = batch["id"].tolist()
    assert batch["img"] == [image(i) for i in ids]
    assert batch["text"] == [f"row {i}" for i in ids]
    if ragged:
        assert [t.tolist() for t in batch["tokens"]] == [tokens(i) for i in ids]
    else:
        lengths = batch["tokens_lengths"].tolist()
        assert lengths == [i % 6 for i in ids] and batch["tokens"].shape == (len(ids), max(lengths))
        assert [row[:n] for row, n in zip(batch["tokens"].tolist(), lengths)] == [tokens(i) for i in ids]
    assert batch["grid"].shape == (len(ids), 2, 3)
    assert torch.equal(batch["grid"][:, 1, 1], -batch["id"].float())


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_every_kind_holds_the_rows_of_the_batch(handle, small_units, shuffle, drop_last):
    per_rank = []
    for rank in range(3):
        loader = make_loader(handle, rank=rank, world_size=3, batch_size=16, shuffle=shuffle, drop_last=drop_last,
                             seed=4, epoch=1)
        loader._window_rows = 60  # windows of 15, 30, 60 rows: rows carried from one window to the next
        per_rank.append(list(loader))
    assert len({len(b) for b in per_rank}) == 1
    for batches in per_rank:
        for b in batches:
            check_rows(b)
            assert b["img"] and isinstance(b["img"][0], bytes) and isinstance(b["text"][0], str)
            assert b["tokens"].dtype == torch.int64 and b["tokens_lengths"].dtype == torch.int64
            assert b["grid"].dtype == torch.float32
    seen = [i for batches in per_rank for b in batches for i in b["id"].tolist()]
    assert len(seen) == len(set(seen)) == 576 if drop_last else set(seen) == set(range(N))


def test_the_new_kinds_take_the_order_the_numbers_alone_take(handle, small_units):
    # The same windows (forced to one size: their size follows the loaded columns' bytes) give the same epoch
    # order, whether or not the variable-size columns are loaded.
    def ids(columns):
        loader = make_loader(handle, rank=1, world_size=2, batch_size=16, seed=9, epoch=3, columns=columns)
        loader._window_rows = 50
        return [i for b in loader for i in b["id"].tolist()]

    assert ids(["id", "img", "text", "tokens"]) == ids(["id"]) == ids(["tokens", "id", "pixels"])


def test_padding_side_value_dtype_and_ragged(handle):
    kwargs = dict(rank=0, world_size=1, batch_size=32, shuffle=False, columns=["id", "tokens"])
    right = next(iter(make_loader(handle, **kwargs)))
    assert list(right) == ["id", "tokens", "tokens_lengths"]
    assert right["tokens"][5].tolist() == [5, 6, 7, 8, 9] and right["tokens"][6].tolist() == [0] * 5  # row 6: empty
    assert right["tokens"][2].tolist() == [2, 3, 0, 0, 0]

    left = next(iter(make_loader(handle, pad={"tokens": -1}, pad_side="left", dtypes={"tokens": torch.float64},
                                 **kwargs)))
    assert left["tokens"].dtype == torch.float64
    assert left["tokens"][2].tolist() == [-1, -1, -1, 2, 3] and left["tokens"][6].tolist() == [-1] * 5
    assert torch.equal(left["tokens_lengths"], right["tokens_lengths"])

    ragged = next(iter(make_loader(handle, ragged=["tokens"], **kwargs)))
    assert list(ragged) == ["id", "tokens"]
    assert [t.tolist() for t in ragged["tokens"]] == [tokens(i) for i in range(32)]
    assert ragged["tokens"][6].shape == (0,) and ragged["tokens"][7].dtype == torch.int64
    ragged_bf16 = next(iter(make_loader(handle, ragged="tokens", dtypes={"tokens": torch.bfloat16}, **kwargs)))
    assert ragged_bf16["tokens"][5].dtype == torch.bfloat16 and ragged_bf16["tokens"][5].tolist() == [5, 6, 7, 8, 9]


def test_nested_arrays_and_declared_shapes_are_nd_tensors(handle):
    batch = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=8, shuffle=False, columns=["grid", "pixels"],
                                  shapes={"pixels": (3, 2, 2), "grid": (6,)})))
    assert batch["pixels"].shape == (8, 3, 2, 2) and batch["grid"].shape == (8, 6)
    assert torch.equal(batch["pixels"][:, 2, 1, 1], torch.arange(8).float())
    assert batch["grid"][3].tolist() == [3, -3, 0.5, 3, -3, 0.5]
    assert handle.column("grid").shape == (2, 3) and handle.column("pixels").shape == (12,)
    plain = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=8, shuffle=False, columns=["pixels"])))
    assert plain["pixels"].shape == (8, 12)  # a flat array stays 2-D unless shapes says otherwise


def test_a_batch_moves_to_a_device_with_its_lists(handle):
    batch = next(iter(make_loader(handle, rank=0, world_size=1, batch_size=8, device="cpu", ragged=["tokens"])))
    check_rows(batch, ragged=True)


def test_the_window_counts_the_bytes_of_variable_size_rows(handle, tmp_path):
    from spark_dist.data.read import loader as loader_module

    # The footers say how large a row is: about 2 * 3 bytes of image plus a length, in this dataset.
    assert 6 <= handle.column("img").row_bytes <= 6 + 8 and handle.column("id").row_bytes is None
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": np.arange(40), "img": pa.array([b"x" * 100_000] * 40)}), path,
                   compression="none", use_dictionary=False)
    big = describe_files("big", f"file://{tmp_path}", [f"file://{path}"], {"id": "scalar", "img": "binary"}, {})
    assert 100_000 <= big.column("img").row_bytes <= 100_100
    loader = make_loader(big, rank=0, world_size=1, batch_size=4, columns=["id", "img"])
    assert loader._window_rows == loader_module._WINDOW_BYTES // (8 + int(big.column("img").row_bytes))
    numbers_only = make_loader(big, rank=0, world_size=1, batch_size=4, columns=["id"])
    assert numbers_only._window_rows == loader_module._WINDOW_BYTES // 8
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(40))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(pad={"id": 0}), DatasetError, "pad names column 'id', a scalar column; pad applies to sequence"),
    (dict(pad={"tokens": "x"}), DatasetError, r"pad\['tokens'\] = 'x' is not a number"),
    (dict(ragged=["text"]), DatasetError, "ragged names column 'text', a string column"),
    (dict(ragged=["nope"]), DatasetError, "ragged names column 'nope', which is not loaded"),
    (dict(pad={"tokens": 1}, ragged=["tokens"]), DatasetError, "pad and ragged both name tokens"),
    (dict(dtypes={"img": torch.float32}), DatasetError, "dtypes names column 'img', a binary column"),
    (dict(shapes={"pixels": (5, 2)}), DatasetError, r"shapes\['pixels'\] = \(5, 2\) holds 10 values a row, but the "
                                                    r"column holds 12 \(shape \(12,\)\)"),
    (dict(shapes={"id": (1,)}), DatasetError, "shapes names column 'id', a scalar column"),
    (dict(shapes={"tokens": (5,)}), DatasetError, "shapes names column 'tokens', a sequence column"),
    (dict(pad_side="middle"), ValueError, "pad_side='middle'"),
])
def test_options_that_do_not_fit_a_column_are_refused_by_name(handle, kwargs, error, message):
    with pytest.raises(error, match=message):
        make_loader(handle, rank=0, world_size=1, batch_size=8, **kwargs)


def test_a_lengths_key_that_clashes_with_a_column_is_refused(tmp_path):
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"t": pa.array([[1], [1, 2]] * 8), "t_lengths": np.arange(16)}), path)
    clash = describe_files("clash", f"file://{tmp_path}", [f"file://{path}"], {"t": "sequence", "t_lengths": "scalar"},
                           {})
    with pytest.raises(DatasetError, match=r"'t_lengths', which is also a loaded column.*ragged=\['t'\]"):
        make_loader(clash, rank=0, world_size=1, batch_size=4)
    assert len(list(make_loader(clash, rank=0, world_size=1, batch_size=4, ragged=["t"]))) == 4
    assert list(next(iter(make_loader(clash, rank=0, world_size=1, batch_size=4, columns=["t"])))) == ["t", "t_lengths"]
