"""The Horovod backend and the HorovodRunner drop-in: ``hvd.init()`` with no arguments inside a run, on
local[2] and on the standalone cluster."""
import contextlib
import io
import os
import sys
import textwrap

import psutil
import pytest

from spark_dist import ConfigError, Distributor, HorovodRunner, TrainingFailedError, get_context
from spark_dist.errors import BackendUnavailableError
from spark_dist.config import CONF_HOROVOD_IMPL

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except ImportError:
    HAVE_HOROVOD = False
needs_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod.torch is not installed (make env builds it)")


# -- functions the ranks run --------------------------------------------------------------------------------
def describe_ranks():
    """hvd.init() with no arguments; what Horovod says about this rank, plus an allreduce and an allgather."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    ctx = get_context()
    me = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
          ctx.rank, ctx.local_rank]
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="total")
    views = hvd.allgather(torch.tensor([me]), name="views")  # one row per rank, in rank order
    return {"total": float(total), "views": views.tolist(), "iface": os.environ.get("HOROVOD_GLOO_IFACE"),
            "rendezvous_port": os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")}


def train_linear(steps=40):
    """Different initial weights and data per rank; Horovod makes them one model."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(100 + hvd.rank())  # ranks start apart: broadcast_parameters must align them
    model = torch.nn.Linear(8, 1)
    x = torch.randn(256, 8)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(hvd.allreduce(loss.detach(), name="loss")))  # mean over ranks
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"weights": hvd.allgather(flat.unsqueeze(0), name="weights"), "losses": losses}


def fail_on_rank_one():
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one cannot go on")
    return float(hvd.allreduce(torch.ones(1), name="never"))  # rank 0 waits here until the run aborts


def horovod_runner_main(scale, offset=0.0):
    """A Databricks-style main: keyword arguments only."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="sum")
    return {"size": hvd.size(), "value": float(total) * scale + offset, "parent": os.getppid()}


ELASTIC_ROWS, ELASTIC_BATCH, ELASTIC_EPOCHS = 64, 4, 2
ELASTIC_STEPS = ELASTIC_EPOCHS * ELASTIC_ROWS // (2 * ELASTIC_BATCH)  # a rank's batches in a run of 2 ranks


def train_elastic(kept, die_after=None):
    """Horovod's elastic pattern (its examples' pytorch_mnist_elastic.py): the model, its optimizer, an
    ElasticSampler and the epoch in a TorchState, committed after every batch. Each rank writes the samples of
    each batch it trains to ``kept`` (a line ``<epoch> <ids...>`` in ``a<attempt>-r<rank>``); ``die_after``: rank 1
    of the first attempt is killed right after that many batches' commits."""
    import signal

    import horovod.torch as hvd
    import torch

    hvd.init()
    ctx = get_context()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, ELASTIC_ROWS).unsqueeze(1)
    y = 3 * x + 1
    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(ELASTIC_ROWS)), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    log = open(os.path.join(kept, f"a{ctx.attempt}-r{hvd.rank()}"), "w")

    @hvd.elastic.run
    def train(state):
        done = 0
        for state.epoch in range(state.epoch, ELASTIC_EPOCHS):
            mine = list(state.sampler)
            for b in range(0, len(mine), ELASTIC_BATCH):
                ids = mine[b:b + ELASTIC_BATCH]
                state.optimizer.zero_grad()
                ((state.model(x[ids]) - y[ids]) ** 2).mean().backward()
                state.optimizer.step()
                log.write(f"{state.epoch} {' '.join(map(str, ids))}\n")
                log.flush()
                state.sampler.record_batch(b // ELASTIC_BATCH, ELASTIC_BATCH)
                state.commit()
                done += 1
                if ctx.attempt == 0 and hvd.rank() == 1 and done == die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            state.sampler.set_epoch(state.epoch + 1)
        return {name: p.detach().clone() for name, p in state.model.named_parameters()}

    return train(state)


def ddp_allreduce():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value)


# -- runs on Spark ------------------------------------------------------------------------------------------
def _check_ranks(out):
    assert out["total"] == 3.0  # 1 + 2
    # [rank, size, local_rank, local_size, cross_rank, cross_size, ctx.rank, ctx.local_rank]; both tasks run
    # on 127.0.0.1, so they share one host: local_size 2, cross_size 1.
    assert out["views"] == [[0, 2, 0, 2, 0, 1, 0, 0], [1, 2, 1, 2, 0, 1, 1, 1]]
    assert out["iface"] == "lo"


@needs_horovod
def test_hvd_init_just_works_standalone(spark_standalone):
    _check_ranks(Distributor(2, backend="horovod", verbose=False).run(describe_ranks))


def _check_training(out):
    weights = out["weights"]
    assert weights.shape == (2, 9)
    assert bool((weights[0] == weights[1]).all()), "ranks ended with different weights"
    losses = out["losses"]
    assert losses[-1] < 0.1 * losses[0], losses


@needs_horovod
def test_distributed_optimizer_trains_one_model_standalone(spark_standalone):
    _check_training(Distributor(2, backend="horovod", verbose=False).run(train_linear, steps=30))


def _my_listeners():
    return {c.laddr for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}


@needs_horovod
def test_failing_rank_is_reported_with_its_traceback(spark_local):
    listening_before = _my_listeners()
    with pytest.raises(TrainingFailedError) as info:
        Distributor(2, backend="horovod", verbose=False, timeout=120).run(fail_on_rank_one)
    assert _my_listeners() == listening_before  # the rendezvous server (and the run's store) are gone
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank one cannot go on" in str(err)
    assert "fail_on_rank_one" in err.remote_traceback
    assert isinstance(err.cause, ValueError)


@needs_horovod
def test_script_under_horovod(spark_standalone, tmp_path):
    script = tmp_path / "train_hvd.py"
    script.write_text(textwrap.dedent("""
        import sys
        import horovod.torch as hvd
        import torch
        hvd.init()
        total = hvd.allreduce(torch.tensor([10.0 * (hvd.rank() + 1)]), op=hvd.Sum)
        with open(f"{sys.argv[1]}.rank{hvd.rank()}", "w") as f:
            f.write(f"{hvd.size()} {float(total)}")
    """))
    out = tmp_path / "out"
    assert Distributor(2, backend="horovod", verbose=False).run(str(script), str(out)) is None
    assert (tmp_path / "out.rank0").read_text() == "2 30.0"
    assert (tmp_path / "out.rank1").read_text() == "2 30.0"


# -- HorovodRunner ------------------------------------------------------------------------------------------
@needs_horovod
def test_horovod_runner_on_spark_tasks(spark_local):
    hr = HorovodRunner(np=2)
    out = hr.run(horovod_runner_main, scale=10.0, offset=0.5)
    assert out["size"] == 2 and out["value"] == 10.5
    assert out["parent"] != os.getpid()  # a Spark task's Python worker started rank 0


def chatty_main(message):
    """Prints a line, and sends one to the driver the Databricks way."""
    import horovod.torch as hvd

    from spark_dist import log_to_driver  # was: from sparkdl.horovod import log_to_driver

    hvd.init()
    print(f"noise from rank {hvd.rank()}")
    if hvd.rank() == 0:
        log_to_driver(message + "!" * 5000)  # cut at 4000 characters, as Databricks does
    return hvd.size()


@needs_horovod
@pytest.mark.parametrize("verbosity", ["log_callback_only", "all"])
def test_horovod_runner_shows_log_to_driver_always_and_rank_output_only_with_all(spark_local, verbosity):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert HorovodRunner(np=2, driver_log_verbosity=verbosity).run(chatty_main, message="hello") == 2
    text = out.getvalue()
    assert ("hello" + "!" * 3995) in text.splitlines()
    assert ("[rank 1] noise from rank 1" in text) == (verbosity == "all")


@needs_horovod
def test_horovod_runner_np_zero_uses_every_slot(spark_standalone):
    out = HorovodRunner(np=0).run(horovod_runner_main, scale=1.0)
    assert out["size"] == 2  # the cluster's two 1-core executors


# -- Horovod's API on torch.distributed (spark_dist.horovod) --------------------------------------------------
@needs_horovod
def test_the_same_horovod_program_trains_alike_on_horovod_and_on_torch_distributed(spark_local, runtime_conf,
                                                                                   capfd):
    runtime_conf(CONF_HOROVOD_IMPL, "horovod")
    real = Distributor(2, backend="horovod", verbose=False).run(train_linear, steps=30)
    runtime_conf(CONF_HOROVOD_IMPL, "torch")
    ours = Distributor(2, backend="horovod", verbose=False).run(train_linear, steps=30)
    Distributor(2, backend="horovod", verbose=False).run(train_linear, steps=1)
    _check_training(ours)
    assert ours["weights"].allclose(real["weights"], atol=1e-6)
    assert max(abs(a - b) for a, b in zip(ours["losses"], real["losses"])) < 1e-6
    said = capfd.readouterr().err
    assert said.count("backend='horovod' runs Horovod's API on torch.distributed (spark_dist.horovod)") == 1


def test_without_horovod_its_api_runs_on_torch_distributed_and_asking_for_horovod_fails_before_any_job(
        spark_local, runtime_conf, monkeypatch):
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "horovod", None)  # `import horovod...` now raises ImportError
    _check_ranks(Distributor(2, backend="horovod", verbose=False).run(describe_ranks))  # auto: ours
    runtime_conf(CONF_HOROVOD_IMPL, "horovod")
    with pytest.raises(BackendUnavailableError) as info:
        Distributor(2, backend="horovod", verbose=False).run(describe_ranks)
    assert "make env" in str(info.value) and f"{CONF_HOROVOD_IMPL}=torch" in str(info.value)
    runtime_conf(CONF_HOROVOD_IMPL, "mpi")
    with pytest.raises(ConfigError, match=f"{CONF_HOROVOD_IMPL} must be one of auto, horovod, torch, got 'mpi'"):
        Distributor(2, backend="horovod", verbose=False).run(describe_ranks)
    assert Distributor(2, backend="ddp", verbose=False).run(ddp_allreduce) == 2.0


def test_an_elastic_horovod_program_goes_on_from_its_last_commit_after_a_lost_rank(spark_local, runtime_conf,
                                                                                   tmp_path):
    # spark_dist's Horovod on torch.distributed: the retry starts the function again, and hvd.elastic.run restores
    # the last commit (rank 0's checkpoint of the run) before it syncs the state: training goes on from there,
    # every sample of each epoch trained once across the two attempts, and the weights are the uninterrupted
    # run's, bit for bit (gloo on CPU).
    runtime_conf(CONF_HOROVOD_IMPL, "torch")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    for kept in (whole, broken):
        kept.mkdir()
        os.chmod(kept, 0o777)
    expected = Distributor(2, backend="horovod", verbose=False).run(train_elastic, str(whole))
    out = Distributor(2, backend="horovod", verbose=False, max_retries=1,
                      checkpoint_dir=str(tmp_path / "checkpoints")).run(train_elastic, str(broken), die_after=5)
    assert all(torch_equal(out[name], expected[name]) for name in expected), (out, expected)
    lines = {name: (broken / name).read_text().splitlines() for name in ("a0-r0", "a0-r1", "a1-r0", "a1-r1")}
    assert len(lines["a1-r0"]) == len(lines["a1-r1"]) < ELASTIC_STEPS  # went on, not from the start
    resumed_at = ELASTIC_STEPS - len(lines["a1-r0"])  # the commits the retry went on from
    assert resumed_at in (5, 4)  # rank 1's 5th commit; the 4th where rank 0's 5th was cut short by the abort
    trained = lines["a0-r0"][:resumed_at] + lines["a0-r1"][:resumed_at] + lines["a1-r0"] + lines["a1-r1"]
    for epoch in range(ELASTIC_EPOCHS):
        ids = sorted(int(i) for line in trained if line.split()[0] == str(epoch) for i in line.split()[1:])
        assert ids == list(range(ELASTIC_ROWS)), (epoch, ids)


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)
