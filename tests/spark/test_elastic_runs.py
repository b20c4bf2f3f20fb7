"""Elastic runs and preemption notices on the standalone cluster (spark_dist.driver.elastic): a worker is
decommissioned mid-run, as its decommission script does (SIGPWR to the worker); the ranks hear it, rank 0 stops at
its next checkpoint, the decommissioned executor exits once the run has left it, the run goes on with the one slot
left, and grows back to two ranks at a checkpoint once a new worker has joined. Every epoch still trains on every
row once. Under Horovod, and under TorchDistributor (elastic through the conf key) with an FSDP2 model whose
sharded checkpoints reshard on each resize. DDP, a lost host and its return: tests/spark/test_two_hosts.py.
"""
import collections
import os
import signal
import sys
import threading
import time

import psutil
import pyspark
import pytest
import torch
import torch.distributed as dist

from spark_dist import Distributor, RunResized, TorchDistributor, get_context
from spark_dist.config import CONF_HOROVOD_IMPL, CONF_MIN_PROCESSES

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from train_fsdp import sharded_model  # noqa: E402

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except ImportError:
    HAVE_HOROVOD = False
needs_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod.torch is not installed (make env builds it)")

ROWS, BATCH = 64, 4
EPOCHS, STEP_S = 16, 0.25  # paced steps: time enough for the cluster's events (with room on a loaded machine); the grown attempt runs unpaced
# The FSDP2 run: one epoch of 1-row batches, so that both resizes fall inside it: its second resumes from a place
# dealt out by the first (a loader state with its origin), written and read as sharded checkpoints.
SHARDED_ROWS = 128


def elastic_train(epochs, step_seconds, lr=0.05, keep_dir=None, heard_dir=None, until_step=None, horovod=False,
                  fast_from_attempt=None):
    """A linear regression under DDP (or Horovod's optimizer, ``horovod=True``) that checkpoints after every step
    and reports the rows of each step: the recipe of docs/elastic.md, with the learning rate scaled to the ranks
    (Goyal's rule). Each step pauses ``step_seconds``, until attempt ``fast_from_attempt`` (the test's events
    are over: the rest runs at full speed). ``keep_dir``: rank 0 also keeps each checkpoint there, as
    ``step-N.pt``; ``heard_dir``: each rank writes a preemption notice's reason there when it hears one
    (``heard-<attempt>-<rank>``), and rank 0 the time it stopped at a checkpoint (``stopped-<attempt>``);
    ``until_step``: stop after that step."""
    ctx = get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    if horovod:
        import horovod.torch as hvd

        hvd.init()
        wrapped = model
    else:
        dist.init_process_group("gloo")
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    listen_for_notices(ctx, heard_dir)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr * ctx.world_size / ctx.initial_world_size)
    if horovod:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loader = ctx.loader("train", batch_size=BATCH)
    state, step = ctx.load_checkpoint(), 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # the state holds the last attempt's rate
            group["lr"] = lr * ctx.world_size / ctx.initial_world_size
        loader.load_state_dict(state["loader"])
        step = state["step"]
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            if step == until_step:
                break
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(wrapped(batch["x"].view(-1, 1)), batch["y"].view(-1, 1))
            loss.backward()
            optimizer.step()
            step += 1
            report_step(ctx, step, epoch, batch)
            saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "loader": loader.state_dict(), "step": step}
            if keep_dir is not None and ctx.rank == 0:
                torch.save(saved, os.path.join(keep_dir, f"step-{step}.pt"))
            checkpoint(ctx, saved, heard_dir)
            pause(ctx, step_seconds, fast_from_attempt)
    if horovod:
        hvd.shutdown()
    else:
        dist.destroy_process_group()
    return {"weight": model.weight.detach().clone(), "bias": model.bias.detach().clone(), "step": step}


def hvd_elastic_train(epochs, step_seconds, heard_dir=None, fast_from_attempt=None):
    """A linear regression written to Horovod's elastic API (hvd.elastic.run, a TorchState with the model, its
    optimizer, an ElasticSampler over the rows and the step count, committed after every step), run by spark_dist's
    own implementation: its commits are the run's checkpoints, so each attempt goes on from the last one; it reports
    the rows of each step as :func:`elastic_train` does."""
    import horovod.torch as hvd

    hvd.init()
    ctx = get_context()
    listen_for_notices(ctx, heard_dir)
    x = torch.arange(ROWS, dtype=torch.float32) / ROWS
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(ROWS)), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            mine = list(state.sampler)
            for b in range(0, len(mine), BATCH):
                ids = torch.tensor(mine[b:b + BATCH])
                state.optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(state.model(x[ids].view(-1, 1)), (2 * x[ids] + 1).view(-1, 1))
                loss.backward()
                state.optimizer.step()
                state.step += 1
                report_step(ctx, state.step, state.epoch, {"id": ids})
                state.sampler.record_batch(b // BATCH, BATCH)
                checkpoint(ctx, None, heard_dir, commit=state.commit)
                pause(ctx, step_seconds, fast_from_attempt)
            state.sampler.set_epoch(state.epoch + 1)
        return {"step": state.step}

    return train(state)


def sharded_train(epochs, step_seconds, heard_dir=None, fast_from_attempt=None, batch_size=BATCH):
    """elastic_train's steps on an FSDP2 model (tests/scripts/train_fsdp.py's), with sharded checkpoints of the
    live model, optimizer and loader that reshard on load to the attempt's number of ranks."""
    ctx = get_context()
    dist.init_process_group("gloo")
    listen_for_notices(ctx, heard_dir)
    model = sharded_model(ctx.world_size, ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = ctx.loader("train", batch_size=batch_size)
    state = {"model": model, "optimizer": optimizer, "loader": loader, "step": 0}
    step = (ctx.load_checkpoint(into=state) or state)["step"]
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["xs"]).squeeze(1), batch["y"])
            loss.backward()
            optimizer.step()
            step += 1
            report_step(ctx, step, epoch, batch)
            checkpoint(ctx, {**state, "step": step}, heard_dir)
            pause(ctx, step_seconds, fast_from_attempt)
    dist.destroy_process_group()
    return {"step": step, "world_size": ctx.world_size}


def listen_for_notices(ctx, heard_dir):
    if heard_dir is not None:
        def heard(reason):
            with open(os.path.join(heard_dir, f"heard-{ctx.attempt}-{ctx.rank}"), "w") as f:
                f.write(reason)
        ctx.on_preemption(heard, every=0.05)


def report_step(ctx, step, epoch, batch):
    ctx.report(step=step, epoch=epoch, ids=batch["id"].tolist(), world=ctx.world_size, resized=ctx.resized,
               preempted=ctx.preempted)


def checkpoint(ctx, state, heard_dir, commit=None):
    """``ctx.save_checkpoint`` (or ``commit()``: an hvd.elastic state's); rank 0 notes when it stopped there
    (RunResized goes on up: let it through)."""
    try:
        if commit is not None:
            commit()
        else:
            ctx.save_checkpoint(state)
    except RunResized:
        if heard_dir is not None:
            with open(os.path.join(heard_dir, f"stopped-{ctx.attempt}"), "w") as f:
                f.write(repr(time.time()))
        raise


def pause(ctx, step_seconds, fast_from_attempt):
    if fast_from_attempt is None or ctx.attempt < fast_from_attempt:
        time.sleep(step_seconds)


def dataset(spark, rows=ROWS):
    from pyspark.sql import functions as F

    x = (F.col("id") / rows).cast("float")
    xs = F.array(x, x * x, x * x * x, 1 - x).cast("array<float>")  # sharded_model's 4 inputs
    return spark.range(rows).select("id", x.alias("x"), xs.alias("xs"), (2 * x + 1).cast("float").alias("y"))


def wait_for_report(d, matches, timeout=120):
    """Until a report of ``d``'s run under way matches (an operator thread's cue), or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not any(matches(r) for r in list(d.history)) and time.monotonic() < deadline:
        time.sleep(0.05)


def steps_kept(history):
    """The reports of the steps that count: an attempt's steps up to the one the next attempt resumed from
    (a later step of a failed attempt was trained again)."""
    reports = [r for r in history if r.get("rank") is not None]
    first = {}
    for r in reports:
        first.setdefault(r["attempt"], r["step"])
    resumed_at = {a: first[b] - 1 for a, b in zip(sorted(first), sorted(first)[1:])}
    return [r for r in reports if r["step"] <= resumed_at.get(r["attempt"], float("inf"))]


def assert_every_row_once_per_epoch(history, epochs, rows=ROWS):
    trained = collections.defaultdict(list)
    for r in steps_kept(history):
        trained[r["epoch"]].extend(r["ids"])
    assert sorted(trained) == list(range(epochs))
    for epoch, ids in trained.items():
        assert sorted(ids) == list(range(rows)), f"epoch {epoch}: rows missing or trained twice"


def decommission_then_replace(cluster, d, times):
    """The cluster's side, from a thread: decommission worker 0 mid-run as its decommission script does, note
    when its executor exits (by itself: the app has spark.decommission.enabled), then replace the worker once the
    run went on without it (the machine comes back: a new worker, a new executor)."""
    wait_for_report(d, lambda r: r.get("step", 0) >= 3)
    executor = psutil.Process(cluster.executor_pids(worker=0)[0])
    os.kill(cluster.worker_pids[0], signal.SIGPWR)  # what sbin/decommission-worker.sh sends
    wait_for_report(d, lambda r: r.get("world") == 1)
    try:
        executor.wait(timeout=30)
        times["executor gone"] = time.time()
    except psutil.TimeoutExpired:
        pass
    cluster.replace_worker(0)


def run_through_a_decommission(cluster, d, run):
    """``run()`` (``d``'s run) while worker 0 is decommissioned and replaced; its result and the operator's times."""
    times = {}
    helper = threading.Thread(target=decommission_then_replace, args=(cluster, d, times), daemon=True)
    helper.start()
    out = run()
    helper.join()
    return out, times


def assert_heard_shrunk_and_grew_back(d, heard_dir, times, epochs=EPOCHS, rows=ROWS):
    """The notice reached every rank; rank 0 stopped at its checkpoint before the decommissioned executor went;
    the run went on on 1 rank and grew back to 2; every epoch trained on every row once."""
    events = [(r["event"], r["world_size"]) for r in d.history if r.get("event")]
    assert events == [("resize", 2), ("preempted", 1), ("resize", 2)], events
    preempted, grown = [r for r in d.history if r.get("event")][1:]
    assert preempted["reason"].startswith("preempted: executor ") and "being decommissioned" in preempted["reason"]
    assert grown["reason"] == "free slots for 1 more rank: growing to 2"
    # Every rank heard the notice (ctx.on_preemption) before rank 0 stopped at its checkpoint, and only then.
    assert sorted(os.listdir(heard_dir)) == ["heard-0-0", "heard-0-1", "stopped-0", "stopped-1"]
    assert (heard_dir / "heard-0-1").read_text() == preempted["reason"][len("preempted: "):]
    assert "executor gone" in times, "the decommissioned executor did not exit after the run left it"
    assert float((heard_dir / "stopped-0").read_text()) < times["executor gone"]
    reports = [r for r in d.history if r.get("rank") is not None]
    assert not any(r["preempted"] for r in reports if r["attempt"] > 0)  # a new attempt starts with no notice
    assert {(r["attempt"], r["world"], r["resized"]) for r in reports} == {(0, 2, False), (1, 1, True), (2, 2, True)}
    assert_every_row_once_per_epoch(d.history, epochs, rows)
    return reports


@needs_horovod
def test_a_decommissioned_worker_is_heard_and_a_horovod_run_shrinks_then_grows_back(spark_standalone,
                                                                                  standalone_cluster, tmp_path):
    d = Distributor(num_processes=2, min_processes=1, backend="horovod", verbose=False)
    out, times = run_through_a_decommission(standalone_cluster, d, lambda: d.run(
        elastic_train, EPOCHS, STEP_S, heard_dir=str(tmp_path), horovod=True, fast_from_attempt=2,
        datasets={"train": dataset(spark_standalone)}))
    reports = assert_heard_shrunk_and_grew_back(d, tmp_path, times)
    assert out["step"] == max(r["step"] for r in reports)  # no step was trained twice in the end
    assert list(d.history_frame().dropna(subset=["event"])["world_size"]) == [2, 1, 2]


@pytest.mark.skipif(not pyspark.__version__.startswith("3.5"),
                    reason="spark_dist's Horovod runs alike on both lines: the 3.5 line's suite runs it")
def test_a_horovod_elastic_program_shrinks_and_grows_back_from_its_commits(spark_standalone, standalone_cluster,
                                                                           tmp_path):
    # hvd.elastic on spark_dist's Horovod (no Horovod build): the decommission stops the run at rank 0's next
    # commit, the run goes on with 1 rank from it, and grows back to 2 at a later commit; every row once an epoch.
    spark_standalone.conf.set(CONF_HOROVOD_IMPL, "torch")
    try:
        d = Distributor(num_processes=2, min_processes=1, backend="horovod", verbose=False)
        out, times = run_through_a_decommission(standalone_cluster, d, lambda: d.run(
            hvd_elastic_train, EPOCHS, STEP_S, heard_dir=str(tmp_path), fast_from_attempt=2))
    finally:
        spark_standalone.conf.unset(CONF_HOROVOD_IMPL)
    reports = assert_heard_shrunk_and_grew_back(d, tmp_path, times)
    steps = collections.defaultdict(list)
    for r in reports:
        steps[r["attempt"]].append(r["step"])
    for attempt in (1, 2):  # each attempt went on from the commit the last one stopped at, not from the start
        assert min(steps[attempt]) == max(steps[attempt - 1]) + 1, dict(steps)
    assert out["step"] == max(steps[2])


def test_torch_distributor_with_the_conf_key_runs_fsdp2_elastic_on_sharded_checkpoints(spark_standalone,
                                                                                      standalone_cluster, tmp_path):
    # PySpark's class has no min_processes: the conf key makes its runs elastic. Each resize resumes from a
    # sharded checkpoint written by another number of ranks (2 -> 1 merges the shards, 1 -> 2 splits them), the
    # second from a place inside the epoch the first dealt out.
    spark_standalone.conf.set(CONF_MIN_PROCESSES, "1")
    try:
        d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, verbose=False)
        out, times = run_through_a_decommission(standalone_cluster, d, lambda: d.run_with_datasets(
            {"train": dataset(spark_standalone, SHARDED_ROWS)}, sharded_train, 1, STEP_S, str(tmp_path), 2, 1))
    finally:
        spark_standalone.conf.unset(CONF_MIN_PROCESSES)
    reports = assert_heard_shrunk_and_grew_back(d, tmp_path, times, epochs=1, rows=SHARDED_ROWS)
    assert out == {"step": max(r["step"] for r in reports), "world_size": 2}
