"""The ML stages' transform Params without a JVM: their checks, how persistence keeps them, and the contract of
spark_dist.ml.transforms (the loader's batch rebuilt at inference, the model's input, chunked predictions)."""
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from spark_dist import ConfigError
from spark_dist.data import make_loader
from spark_dist.data.handle import ColumnStats, describe_files
from spark_dist.ml import TorchEstimator, TorchModel
from spark_dist.ml import transforms
from spark_dist.ml.persistence import dumps, loads, split_params
from spark_dist.ml.transform_inputs import check_params, describe


def lengths_of(batch):
    """A transform: each text's length as a float feature."""
    return torch.tensor([[float(len(t))] for t in batch["text"]])


def test_transform_params_are_checked_and_default_as_documented():
    est = TorchEstimator(transformFn=lengths_of, transformWorkers=2)
    assert est.getTransformFn() is lengths_of and est.getInferenceTransformFn() is lengths_of
    assert est.getTransformWorkers() == 2 and TorchEstimator().getTransformWorkers() == 0
    plain = est.copy().setInferenceTransformFn(len)
    assert plain.getInferenceTransformFn() is len and est.getInferenceTransformFn() is lengths_of
    with pytest.raises(TypeError, match='param "transformFn".*need a callable'):
        TorchEstimator(transformFn="decode")
    with pytest.raises(TypeError, match='param "inferenceTransformFn".*need a callable'):
        TorchEstimator().setInferenceTransformFn(3)
    with pytest.raises(ConfigError, match="transformWorkers=-1"):
        TorchEstimator(transformWorkers=-1)
    assert TorchModel(transformFn=lengths_of).getInferenceTransformFn() is lengths_of
    assert TorchModel().getTransformFn() is None and TorchModel().getInferenceTransformFn() is None


def test_a_transform_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="inferenceTransformFn is set but transformFn is not"):
        check_params(TorchEstimator(inferenceTransformFn=lengths_of))
    with pytest.raises(ConfigError, match="transformWorkers=3 has no transform"):
        check_params(TorchEstimator(transformWorkers=3))
    assert check_params(TorchEstimator()) == (None, None)
    assert check_params(TorchEstimator(transformFn=lengths_of)) == (lengths_of, lengths_of)


def test_transforms_are_kept_with_the_objects_and_travel_by_value():
    scale = 3.0
    est = TorchEstimator(model=nn.Linear(1, 2), transformFn=lambda b: lengths_of(b) * scale,
                         inferenceTransformFn=lengths_of, transformWorkers=1)
    json_params, objects = split_params(est)
    assert sorted(objects) == ["inferenceTransformFn", "model", "transformFn"]
    assert json_params["transformWorkers"] == 1 and "transformFn" not in json_params
    back = loads(dumps(objects))
    batch = {"text": ["ab", "abcd"]}
    assert torch.equal(back["transformFn"](batch), torch.tensor([[6.0], [12.0]]))
    assert torch.equal(back["inferenceTransformFn"](batch), torch.tensor([[2.0], [4.0]]))


# -- the model's input ------------------------------------------------------------------------------------
class TwoInputs(nn.Module):
    def forward(self, input_ids, mask):
        return (input_ids * mask).sum(dim=1, keepdim=True).float()


def test_what_a_transform_returns_reaches_the_model_as_documented():
    x = torch.ones(2, 3)
    linear = nn.Linear(3, 1)
    assert torch.equal(transforms.forward(linear, x), linear(x))
    assert torch.equal(transforms.forward(linear, {"pixels": x}), linear(x))  # one entry: positional
    ids, mask = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 0], [1, 1]])
    assert transforms.forward(TwoInputs(), {"mask": mask, "input_ids": ids}).tolist() == [[1.0], [7.0]]
    assert transforms.forward(TwoInputs(), (ids, mask)).tolist() == [[1.0], [7.0]]
    with pytest.raises(TypeError, match="transform returned a str"):
        transforms.forward(linear, "x")
    assert describe({"a": x, "b": ["s"]}) == "{'a': tensor(2, 3) float32, 'b': list of 1 str}"


def test_the_fit_transform_sees_the_features_not_the_label_and_pickles_by_reference():
    seen = []
    fit = transforms.FitTransform(lambda b: seen.append(sorted(b)) or b["text"], "label")
    out = fit({"text": ["a"], "label": torch.tensor([1])})
    assert seen == [["text"]] and out["inputs"] == ["a"] and out["label"].tolist() == [1]
    assert b"spark_dist.ml.transforms" in pickle.dumps(transforms.FitTransform(lengths_of, "label"))


# -- the loader's batch, rebuilt at inference ---------------------------------------------------------------
ROWS = {
    "image": [b"\xff\xd8jpeg", b"", b"\x00\x01"],
    "text": ["a cat", "", "dogs"],
    "tokens": [[5, 6, 7], [8], []],
    "pixels": [[0.5, 1.5], [2.5, 3.5], [4.5, 5.5]],
    "grid": [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [1, 2, 3]], [[0, 0, 0], [1, 1, 1]]],
    "count": [1, 2, 3],
    "weight": [0.25, 0.5, 0.75],
}
KINDS = {"image": "binary", "text": "string", "tokens": "sequence", "pixels": "array", "grid": "nested",
         "count": "scalar", "weight": "scalar"}


def test_a_batch_at_inference_is_the_batch_the_loader_gives(tmp_path):
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({
        **{c: ROWS[c] for c in ("image", "text", "tokens", "grid")},
        "pixels": pa.array(ROWS["pixels"], pa.list_(pa.float32())),
        "count": pa.array(ROWS["count"], pa.int32()), "weight": pa.array(ROWS["weight"], pa.float64()),
    }), path)
    stats = {"pixels": ColumnStats(length=2), "grid": ColumnStats(length=6, shape=(2, 3)),
             "tokens": ColumnStats(length_range=(0, 3))}
    handle = describe_files("rows", f"file://{tmp_path}", [f"file://{path}"], KINDS, stats)
    [loaded] = list(make_loader(handle, rank=0, world_size=1, batch_size=3, shuffle=False))
    # What a pandas UDF's Series give (to_numpy()): object arrays of bytes, str and numpy arrays; numbers as numpy.
    as_pandas = {
        "image": np.array([bytearray(b) for b in ROWS["image"]], dtype=object),
        "text": np.array(ROWS["text"], dtype=object),
        "tokens": np.array([np.array(r, dtype=np.int64) for r in ROWS["tokens"]] + [None], dtype=object)[:3],
        "pixels": np.array([np.array(r) for r in ROWS["pixels"]] + [None], dtype=object)[:3],
        "grid": np.array([np.array([np.array(r) for r in g], dtype=object) for g in ROWS["grid"]] + [None],
                         dtype=object)[:3],
        "count": np.array(ROWS["count"], dtype=np.int32), "weight": np.array(ROWS["weight"]),
    }
    rebuilt = transforms.batch_of(as_pandas, KINDS)
    assert sorted(rebuilt) == sorted(loaded)  # tokens_lengths too
    for name, value in loaded.items():
        if isinstance(value, torch.Tensor):
            assert rebuilt[name].dtype == value.dtype and torch.equal(rebuilt[name], value), name
        else:
            assert rebuilt[name] == value and all(type(v) is type(w) for v, w in zip(rebuilt[name], value)), name


def test_a_null_is_named_and_an_empty_batch_predicts_nothing():
    with pytest.raises(ValueError, match="column 'image' holds null values"):
        transforms.batch_of({"image": np.array([b"x", None], dtype=object)}, {"image": "binary"})
    empty = transforms.batch_of({"text": np.array([], dtype=object)}, {"text": "string"})
    assert transforms.predict_rows(nn.Linear(1, 2), lengths_of, empty, 4).shape == (0, 0)


def test_predictions_in_chunks_equal_one_pass():
    torch.manual_seed(0)
    model = nn.Linear(1, 3)
    batch = {"text": ["x" * i for i in range(10)]}
    calls = []

    def counted(b):
        calls.append(len(b["text"]))
        return lengths_of(b)

    chunked = transforms.predict_rows(model, counted, batch, 4)
    assert calls == [4, 4, 2]
    with torch.no_grad():
        whole = model(lengths_of(batch)).double().numpy()
    np.testing.assert_allclose(chunked, whole)
