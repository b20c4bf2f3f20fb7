"""Sharded checkpoints (``ctx.save_checkpoint`` of an FSDP2 model): ranks here are processes this test spawns,
joined over gloo, each with the TrainContext a run would give it; no Spark. A real run resuming from them is in
tests/spark/test_fsdp_runs.py."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing.spawn import ProcessException  # noqa: E402

from spark_dist.task.context import TrainContext  # noqa: E402
from spark_dist.errors import ConfigError  # noqa: E402
from spark_dist.task import sharded_checkpoints  # noqa: E402
from tests.unit.gloo_ranks import run_ranks  # noqa: E402


def sharded_mlp(world_size, seed=0):
    """A small MLP, each Linear and the whole wrapped with FSDP2's ``fully_shard`` over this run's ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full_weights(model):
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def step(model, optimizer, seed):
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()


def sharded_training(ctx):
    """The model and optimizer every scenario here trains: ``sharded_mlp`` over the ranks, with Adam."""
    model = sharded_mlp(ctx.world_size)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def train_and_save(ctx):
    """Three steps, a checkpoint after each (the last asynchronous, the weights changed right after it)."""
    model, optimizer = sharded_training(ctx)
    saved = []
    for i in range(3):
        step(model, optimizer, seed=i)
        ctx.report(loss=float(3 - i))
        ctx.save_checkpoint({"model": model, "optimizer": optimizer, "step": i}, async_save=i == 2, keep=2)
        saved.append(full_weights(model))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(100.0)  # after the async save returned: its staged copy must not see this
    return saved


def resume_and_step(ctx):
    model, optimizer = sharded_training(ctx)
    state = ctx.load_checkpoint(into={"model": model, "optimizer": optimizer, "step": -1})
    loaded = full_weights(model)
    step(model, optimizer, seed=3)
    return {"step": state["step"], "loaded": loaded, "next": full_weights(model)}


def four_steps(ctx):
    model, optimizer = sharded_training(ctx)
    for i in range(4):
        step(model, optimizer, seed=i)
    return full_weights(model)


def test_saved_by_two_ranks_resumes_on_one_exactly(tmp_path):
    directory = str(tmp_path / "run")
    two = run_ranks(2, directory, train_and_save, tmp_path)[0]
    kept = sharded_checkpoints.committed(directory)
    assert [c.seq for c in kept] == [2, 3]  # keep=2: the first was removed once the third was committed
    assert [r["_checkpoint"]["seq"] for r in two["reports"] if "_checkpoint" in r] == [1, 2, 3]
    assert two["reports"][-1]["_checkpoint"]["removed"] == [kept[0].path.replace("00000002", "00000001")]

    one = run_ranks(1, directory, resume_and_step, tmp_path)[0]  # resharded: every parameter whole on one rank
    assert one["result"]["step"] == 2
    for name, weight in two["result"][2].items():
        assert torch.equal(one["result"]["loaded"][name], weight), name

    # The optimizer's state came back too: the next step equals the one an uninterrupted single rank takes.
    whole = run_ranks(1, str(tmp_path / "other"), four_steps, tmp_path)[0]["result"]
    for name, weight in whole.items():
        assert torch.allclose(one["result"]["next"][name], weight, atol=1e-6), name

    full = sharded_checkpoints.load_full(kept[-1].path)  # no process group: every tensor whole
    assert full["step"] == 2 and set(full) == {"model", "optimizer", "step"}
    assert all(torch.equal(full["model"][k], w) for k, w in two["result"][2].items())


def save_then_die_before_commit(ctx):
    model, optimizer = sharded_training(ctx)
    step(model, optimizer, seed=0)
    ctx.save_checkpoint({"model": model, "optimizer": optimizer, "step": 0})
    step(model, optimizer, seed=1)
    if ctx.rank == 0:  # rank 0 dies once every shard of the second save is written, before it commits it
        sharded_checkpoints.ShardedCheckpoints._commit = lambda *a: os._exit(3)
    ctx.save_checkpoint({"model": model, "optimizer": optimizer, "step": 1})


def resume_then_save(ctx):
    model, optimizer = sharded_training(ctx)
    state = ctx.load_checkpoint(into={"model": model, "optimizer": optimizer, "step": -1})
    ctx.save_checkpoint({"model": model, "optimizer": optimizer, "step": state["step"] + 1})
    return state["step"]


def test_a_save_cut_short_before_its_commit_is_never_loaded(tmp_path):
    directory = str(tmp_path / "run")
    with pytest.raises(ProcessException):  # rank 0 exits; rank 1 may fail at the group it shared with it
        run_ranks(2, directory, save_then_die_before_commit, tmp_path)
    root = sharded_checkpoints.sharded_root(directory)
    assert sorted(os.listdir(root)) == ["00000001", "00000002"]
    assert ".metadata" in os.listdir(os.path.join(root, "00000002"))  # complete on disk, yet not committed
    assert [c.seq for c in sharded_checkpoints.committed(directory)] == [1]

    assert run_ranks(2, directory, resume_then_save, tmp_path)[0]["result"] == 0
    assert sorted(os.listdir(root)) == ["00000001", "00000003"]  # the torn one went with the next commit


def best_two_by_loss(ctx):
    model, optimizer = sharded_training(ctx)
    for i, loss in enumerate([3.0, 1.0, 2.0, 0.5, 4.0]):
        ctx.report(val_loss=loss)
        ctx.save_checkpoint({"model": model, "step": i}, sharded=True, keep=2, metric="val_loss")
    with pytest.raises(ValueError, match="metric 'acc' was never reported by rank .*reported so far: val_loss"):
        ctx.save_checkpoint({"model": model}, sharded=True, metric="acc")


def test_keep_the_best_by_a_reported_metric_and_the_latest(tmp_path):
    directory = str(tmp_path / "run")
    reports = run_ranks(2, directory, best_two_by_loss, tmp_path)[0]["reports"]
    kept = sharded_checkpoints.committed(directory)
    assert [(c.seq, c.score) for c in kept] == [(2, 1.0), (4, 0.5), (5, 4.0)]  # best two, and the latest
    with open(os.path.join(kept[0].path, sharded_checkpoints.MARKER)) as f:
        assert json.load(f)["metric"] == "val_loss"

    from spark_dist.driver.distributor import Distributor

    d = Distributor(num_processes=2, local_mode=True, verbose=False)
    for record in reports:
        d._on_report(record)
    assert d.best_checkpoint == kept[1].path
    assert [c["seq"] for c in d.checkpoints] == [2, 4, 5]


def test_a_checkpoint_someone_else_could_write_is_not_read(tmp_path):
    directory = str(tmp_path / "run")
    run_ranks(1, directory, train_and_save, tmp_path)
    latest = sharded_checkpoints.committed(directory)[-1]
    os.chmod(os.path.join(latest.path, ".metadata"), 0o666)
    with pytest.raises(PermissionError, match="not this user's alone.*spark.dist.checkpointDir"):
        sharded_checkpoints.load_full(latest.path)


def test_options_of_sharded_checkpoints_are_refused_for_rank_zeros(tmp_path):
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                       host="h", checkpoint_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="async_save, keep apply to sharded checkpoints; pass sharded=True"):
        ctx.save_checkpoint({"w": torch.ones(2)}, async_save=True, keep=2)
    with pytest.raises(ValueError, match="keep must be an integer >= 1"):
        ctx.save_checkpoint({"w": torch.ones(2)}, sharded=True, keep=0)
    ctx.save_checkpoint({"w": torch.ones(2)})  # rank 0's file, then a sharded one: the latest is read back
    assert torch.equal(ctx.load_checkpoint()["w"], torch.ones(2))
    ctx.save_checkpoint({"w": torch.zeros(2)}, sharded=True)  # one rank: no process group needed
    assert torch.equal(ctx.load_checkpoint()["w"], torch.zeros(2))


def test_a_checkpoint_that_does_not_fit_the_model_is_named_before_anything_loads(tmp_path):
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                       host="h", checkpoint_dir=str(tmp_path / "run"))
    saved = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    ctx.save_checkpoint({"model": saved, "step": 1}, sharded=True)
    wider = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2), torch.nn.ReLU(),
                                torch.nn.Linear(2, 2))
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        ctx.load_checkpoint(into={"model": wider, "step": 0, "epoch": 0})
    message = str(info.value)
    assert "not in the checkpoint: model.4.weight, model.4.bias, epoch" in message
    assert "of other shapes: model.0.weight saved [32, 8], here [64, 8], model.0.bias saved [32], here [64], " \
           "model.2.weight saved [2, 32], here [2, 64]" in message
    smaller = torch.nn.Sequential(torch.nn.Linear(8, 32))
    with pytest.raises(ConfigError, match="in the checkpoint but not in the model: model.2.weight, model.2.bias"):
        ctx.load_checkpoint(into={"model": smaller})
    assert all(torch.equal(v, before[k]) for k, v in wider.state_dict().items())  # nothing was loaded


class Place:
    """A stateful object whose state grows keys as it goes, as a loader's does inside an epoch dealt out after
    a resize (its ``origin``)."""

    def __init__(self):
        self.state = {"epoch": 0, "batches": 0}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_a_stateful_objects_state_comes_back_whole_even_with_keys_a_fresh_one_lacks(tmp_path):
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                       host="h", checkpoint_dir=str(tmp_path / "run"))
    place = Place()
    place.state = {"epoch": 1, "batches": 3, "origin": {"world_size": 2, "position": 9}}
    ctx.save_checkpoint({"loader": place, "step": 7}, sharded=True)
    fresh = Place()
    assert ctx.load_checkpoint(into={"loader": fresh, "step": 0})["step"] == 7
    assert fresh.state == {"epoch": 1, "batches": 3, "origin": {"world_size": 2, "position": 9}}


def test_a_stateful_objects_state_saved_flattened_by_an_earlier_version_still_loads(tmp_path, monkeypatch):
    from spark_dist.task import checkpoint_state

    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                       host="h", checkpoint_dir=str(tmp_path / "run"))
    place = Place()
    place.state = {"epoch": 2, "batches": 5}
    to_saved = checkpoint_state.to_saved
    with monkeypatch.context() as earlier:  # its state dict as a dict, which DCP flattens into its keys
        earlier.setattr(checkpoint_state, "to_saved", lambda state, stored=None: to_saved(state, stored={}))
        ctx.save_checkpoint({"loader": place, "step": 4}, sharded=True)
    fresh = Place()
    assert ctx.load_checkpoint(into={"loader": fresh, "step": 0})["step"] == 4
    assert fresh.state == {"epoch": 2, "batches": 5}
