"""spark_dist.inference's model loaders, in this process (no JVM): a spark_dist run's checkpoint (and any
``torch.save`` of a state_dict), a pickled module or saved TorchModel directory, a ``transformers`` directory
from ``save_pretrained``, an MLflow ``pytorch`` model; each gives back the module that was saved, in eval
mode, or an error naming the argument to change. tests/spark/test_inference_models_runs.py loads each through
``predict_batch_udf`` on executors."""
import datetime
import json
import os

import pytest
import torch
from torch import nn

from spark_dist.task.context import TrainContext
from spark_dist.inference import (load_from_checkpoint, load_mlflow_model, load_pickled_module, load_pretrained,
                                  read_checkpoint)
from spark_dist.task.checkpoint_dirs import CheckpointDirError

X = torch.linspace(-1, 1, 24).reshape(6, 4)


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.fixture
def trained():
    torch.manual_seed(0)
    return mlp().eval()


def same(loaded, model):
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(X), model(X))


def rank0(directory):
    return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0,
                        run_id="r", host="h", checkpoint_dir=str(directory))


# -- checkpoints ---------------------------------------------------------------------------------------------
def test_a_runs_checkpoint_loads_into_the_module_model_fn_builds(tmp_path, trained):
    run_dir = tmp_path / "checkpoints" / "run-1"
    optimizer = torch.optim.Adam(trained.parameters())
    rank0(run_dir).save_checkpoint({"model": trained.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3})
    for path in (run_dir, run_dir / "checkpoint.pt", f"file:{run_dir}"):  # the run's directory, the file, a URI
        same(load_from_checkpoint(mlp, path), trained)
    assert read_checkpoint(run_dir)["epoch"] == 3
    same(load_from_checkpoint(mlp(), run_dir, key="model"), trained)  # the module itself, the key named


def test_a_bare_state_dict_and_one_of_a_wrapped_model_load_too(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "bare.pt")
    same(load_from_checkpoint(mlp, tmp_path / "bare.pt"), trained)
    # DDP's module. and torch.compile's _orig_mod. before every key, under another usual key
    wrapped = {f"module._orig_mod.{k}": v for k, v in trained.state_dict().items()}
    torch.save({"model_state_dict": wrapped, "step": 10}, tmp_path / "wrapped.pt")
    same(load_from_checkpoint(mlp, tmp_path / "wrapped.pt"), trained)


def test_a_checkpoint_holding_other_objects_is_unpickled_only_where_only_this_user_writes(tmp_path, trained):
    run_dir = tmp_path / "run"
    rank0(run_dir).save_checkpoint({"model": trained.state_dict(), "saved": datetime.date(2026, 1, 2)})
    same(load_from_checkpoint(mlp, run_dir), trained)  # not tensors alone: checked, then unpickled
    os.chmod(run_dir, 0o777)
    with pytest.raises(CheckpointDirError, match="holds objects other than tensors.*not this user's alone"):
        load_from_checkpoint(mlp, run_dir)
    os.chmod(run_dir, 0o700)
    os.chmod(run_dir / "checkpoint.pt", 0o666)
    with pytest.raises(CheckpointDirError, match="writable by its owner alone"):
        load_from_checkpoint(mlp, run_dir)
    os.chmod(run_dir / "checkpoint.pt", 0o600)
    torch.save(trained.state_dict(), run_dir / "weights.pt")
    os.chmod(run_dir, 0o777)  # tensors alone need no check: nothing is unpickled
    same(load_from_checkpoint(mlp, run_dir / "weights.pt"), trained)


def test_what_cannot_be_loaded_names_the_argument(tmp_path, trained):
    torch.save({"model": trained.state_dict(), "opt": {"lr": torch.tensor(1.0)}, "epoch": 1}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match=r"key='net': no such entry .*\['epoch', 'model', 'opt'\]"):
        load_from_checkpoint(mlp, tmp_path / "c.pt", key="net")
    torch.save({"weights": trained.state_dict(), "epoch": 1}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"holds no state_dict.*\['epoch', 'weights'\]\); name the module's state "
                                         "with key="):
        load_from_checkpoint(mlp, tmp_path / "odd.pt")
    same(load_from_checkpoint(mlp, tmp_path / "odd.pt", key="weights"), trained)
    with pytest.raises(RuntimeError, match=r"(?s)Unexpected key.*build the architecture .*strict=False"):
        load_from_checkpoint(lambda: nn.Sequential(nn.Linear(4, 3)), tmp_path / "c.pt")
    with pytest.raises(TypeError, match="model_fn returned dict, not a torch.nn.Module"):
        load_from_checkpoint(dict, tmp_path / "c.pt")
    with pytest.raises(FileNotFoundError, match="path=.*no such checkpoint on this host"):
        load_from_checkpoint(mlp, tmp_path / "absent.pt")
    with pytest.raises(FileNotFoundError, match="a directory without checkpoint.pt"):
        load_from_checkpoint(mlp, tmp_path)
    with pytest.raises(ValueError, match="path='hdfs://nn/c.pt' is not a local path"):
        load_from_checkpoint(mlp, "hdfs://nn/c.pt")


def test_a_sharded_checkpoint_is_read_whole_and_a_newer_rank0_one_wins(tmp_path, trained):
    run_dir = tmp_path / "run"
    ctx = rank0(run_dir)
    ctx.save_checkpoint({"model": trained, "step": 3}, sharded=True)  # the live module, as an FSDP2 run saves it
    [shard_dir] = (run_dir / "sharded").iterdir()
    for path in (run_dir, shard_dir):  # the run's directory, whose latest is sharded; one checkpoint's own
        same(load_from_checkpoint(mlp, path), trained)
    other = mlp()
    ctx.save_checkpoint({"model": other.state_dict()})  # rank 0's, newer: other weights
    same(load_from_checkpoint(mlp, run_dir), other)


# -- pickled modules -----------------------------------------------------------------------------------------
def test_a_pickled_module_a_scripted_one_and_a_saved_torch_model_load(tmp_path, trained):
    torch.save(trained, tmp_path / "module.pt")
    same(load_pickled_module(tmp_path / "module.pt"), trained)
    torch.jit.save(torch.jit.script(trained), tmp_path / "scripted.pt")
    same(load_pickled_module(str(tmp_path / "scripted.pt")), trained)
    # A saved TorchModel's layout (spark_dist/ml/persistence.py); the spark test saves a real one.
    from spark_dist.ml.persistence import dumps

    stage = tmp_path / "pipeline" / "stages" / "1_TorchModel_abc"
    (stage / "metadata").mkdir(parents=True)
    (stage / "metadata" / "part-00000").write_text(json.dumps({"class": "spark_dist.ml.model.TorchModel"}) + "\n")
    (stage / "torch.pt").write_bytes(dumps({"model": trained}))
    same(load_pickled_module(stage), trained)
    same(load_pickled_module(tmp_path / "pipeline"), trained)  # its only TorchModel stage
    (stage / "metadata" / "part-00000").write_text(json.dumps({"class": "spark_dist.ml.estimator.TorchEstimator"}))
    with pytest.raises(ValueError, match="holds a saved spark_dist.ml.estimator.TorchEstimator, not a TorchModel"):
        load_pickled_module(stage)


def test_a_state_dict_is_no_pickled_module(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "weights.pt")
    with pytest.raises(TypeError, match="holds a OrderedDict, not a pickled torch.nn.Module: a state_dict, which "
                                        r"load_from_checkpoint\(model_fn, path\)"):
        load_pickled_module(tmp_path / "weights.pt")
    with pytest.raises(FileNotFoundError, match="no saved TorchModel"):
        load_pickled_module(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file on this host"):
        load_pickled_module(tmp_path / "absent.pt")


# -- transformers --------------------------------------------------------------------------------------------
def tiny_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    return transformers.BertForSequenceClassification(config).eval()


TOKENS = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 4, 4, 2, 0, 0]])


def test_a_save_pretrained_directory_loads_with_the_class_that_saved_it(tmp_path):
    model = tiny_bert()
    model.save_pretrained(tmp_path / "bert")
    loaded = load_pretrained(tmp_path / "bert")
    assert type(loaded) is type(model) and not loaded.training
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=TOKENS).logits, model(input_ids=TOKENS).logits)
    base = load_pretrained(f"file:{tmp_path / 'bert'}", model_class="AutoModel")
    assert type(base).__name__ == "BertModel"
    with pytest.raises(ValueError, match="model_class='NoSuchModel' is no class of transformers"):
        load_pretrained(tmp_path / "bert", model_class="NoSuchModel")
    with pytest.raises(FileNotFoundError, match="no config.json .*Hub names are not downloaded here"):
        load_pretrained("bert-base-uncased")


# -- MLflow --------------------------------------------------------------------------------------------------
@pytest.fixture
def mlflow(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return pytest.importorskip("mlflow")


def save_mlflow_model(mlflow, model, path):
    """MLflow's default format (``pt2``: a ``torch.export`` program, no pickle), no requirements inferred."""
    import mlflow.pytorch

    mlflow.pytorch.save_model(model, str(path), input_example=X[:2].numpy(), pip_requirements=["torch"])


def test_an_mlflow_model_loads_from_its_path(tmp_path, trained, mlflow, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where MLflow's defaults would write: nothing may land there
    save_mlflow_model(mlflow, trained, tmp_path / "saved")
    for uri in (str(tmp_path / "saved"), f"file://{tmp_path / 'saved'}"):
        loaded = load_mlflow_model(uri)
        with torch.no_grad():
            assert torch.equal(loaded(X), trained(X))  # batch sizes other than the example's
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # a run's model (tests/spark: on the executors)
    with pytest.raises(ValueError, match="model_uri='runs:/.*' asks the MLflow tracking server.*pass tracking_uri="):
        load_mlflow_model("runs:/0123456789abcdef/model")
    assert os.listdir(tmp_path / "cwd") == []
