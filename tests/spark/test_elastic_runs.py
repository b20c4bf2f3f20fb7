"""Elastic runs and preemption notices on the standalone cluster (spark_dist.driver.elastic): a worker is
decommissioned mid-run, as its decommission script does (SIGPWR to the worker); the ranks hear it, rank 0 stops at
its next checkpoint, the run goes on with the one slot left, and grows back to two ranks at a checkpoint once a
new worker has joined. Every epoch still trains on every row once. The lost-host case: tests/spark/test_two_hosts.py.
"""
import collections
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from spark_dist import Distributor, get_context

ROWS, BATCH = 64, 4


def elastic_train(epochs, step_seconds, lr=0.05, keep_dir=None, heard_dir=None):
    """A linear regression under DDP that checkpoints after every step and reports the rows of each step: the
    recipe of docs/elastic.md, with the learning rate scaled to the ranks (Goyal's rule). ``keep_dir``: rank 0
    also keeps each checkpoint there, as ``step-N.pt``; ``heard_dir``: each rank writes a preemption notice's
    reason there when it hears one (``heard-<attempt>-<rank>``)."""
    ctx = get_context()
    dist.init_process_group("gloo")
    if heard_dir is not None:
        def heard(reason):
            with open(os.path.join(heard_dir, f"heard-{ctx.attempt}-{ctx.rank}"), "w") as f:
                f.write(reason)
        ctx.on_preemption(heard, every=0.05)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr * ctx.world_size / ctx.initial_world_size)
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
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(batch["x"].view(-1, 1)), batch["y"].view(-1, 1))
            loss.backward()
            optimizer.step()
            step += 1
            ctx.report(step=step, epoch=epoch, ids=batch["id"].tolist(), world=ctx.world_size,
                       resized=ctx.resized, preempted=ctx.preempted)
            saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "loader": loader.state_dict(), "step": step}
            if keep_dir is not None and ctx.rank == 0:
                torch.save(saved, os.path.join(keep_dir, f"step-{step}.pt"))
            ctx.save_checkpoint(saved)
            time.sleep(step_seconds)
    dist.destroy_process_group()
    return {"weight": model.weight.detach().clone(), "bias": model.bias.detach().clone(), "step": step}


def dataset(spark):
    from pyspark.sql import functions as F

    x = (F.col("id") / ROWS).cast("float")
    return spark.range(ROWS).select("id", x.alias("x"), (2 * x + 1).cast("float").alias("y"))


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


def assert_every_row_once_per_epoch(history, epochs):
    rows = collections.defaultdict(list)
    for r in steps_kept(history):
        rows[r["epoch"]].extend(r["ids"])
    assert sorted(rows) == list(range(epochs))
    for epoch, ids in rows.items():
        assert sorted(ids) == list(range(ROWS)), f"epoch {epoch}: rows missing or trained twice"


def test_a_decommissioned_worker_is_heard_and_the_run_shrinks_then_grows_back(spark_standalone, standalone_cluster,
                                                                              tmp_path):
    cluster, epochs = standalone_cluster, 10
    d = Distributor(num_processes=2, min_processes=1, verbose=False)

    def operator():
        """The cluster's side: decommission a worker mid-run, then replace it once the run went on without it."""
        wait_for_report(d, lambda r: r.get("step", 0) >= 3)
        os.kill(cluster.worker_pids[0], signal.SIGPWR)  # what sbin/decommission-worker.sh sends
        wait_for_report(d, lambda r: r.get("world") == 1)
        cluster.replace_worker(0)  # the machine comes back: a new worker, a new executor

    helper = threading.Thread(target=operator, daemon=True)
    helper.start()
    out = d.run(elastic_train, epochs, 0.25, heard_dir=str(tmp_path), datasets={"train": dataset(spark_standalone)})
    helper.join()
    events = [(r["event"], r["world_size"]) for r in d.history if r.get("event")]
    assert events == [("resize", 2), ("preempted", 1), ("resize", 2)], events
    preempted, grown = [r for r in d.history if r.get("event")][1:]
    assert preempted["reason"].startswith("preempted: executor ") and "being decommissioned" in preempted["reason"]
    assert grown["reason"] == "free slots for 1 more rank: growing to 2"
    reports = [r for r in d.history if r.get("rank") is not None]
    # Every rank heard the notice (ctx.on_preemption) before rank 0 stopped at its checkpoint, and only then.
    assert sorted(os.listdir(tmp_path)) == ["heard-0-0", "heard-0-1"]
    assert (tmp_path / "heard-0-1").read_text() == preempted["reason"][len("preempted: "):]
    assert not any(r["preempted"] for r in reports if r["attempt"] > 0)  # a new attempt starts with no notice
    assert {(r["attempt"], r["world"], r["resized"]) for r in reports} == {(0, 2, False), (1, 1, True), (2, 2, True)}
    assert_every_row_once_per_epoch(d.history, epochs)
    assert out["step"] == max(r["step"] for r in reports)  # no step was trained twice in the end
    frame = d.history_frame()
    assert list(frame.dropna(subset=["event"])["world_size"]) == [2, 1, 2]
