"""Distributor.run on real Spark: functions, scripts, local mode, results, failures, concurrency."""
import os
import re
import signal
import sys
import textwrap
import threading
import time

import pytest

from clusters import still_running_after
from spark_jobs import jobs_started
from test_reliability import stop_bound
from spark_dist import ConfigError, Distributor, TrainingFailedError, get_context
from spark_dist.host import oom_kills
from spark_dist.wire.protocol import ABORT


def allreduce_and_describe(scale, *, offset=0):
    """A rank's view of the run, after a real gloo all-reduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # no address: the torchrun variables point at the run's store
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    ctx = get_context()
    ctx.report(total=float(value))
    views = [None] * ctx.world_size
    dist.all_gather_object(views, {
        "ctx": (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size, ctx.node_rank, ctx.attempt),
        "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                           "MASTER_ADDR", "MASTER_PORT")},
        "pid": os.getpid(),
    })
    dist.destroy_process_group()
    return {"sum": float(value) * scale + offset, "views": views}


def test_function_runs_on_every_rank_and_rank_zero_returns(spark_local):
    d = Distributor(num_processes=2, verbose=False)
    out = d.run(allreduce_and_describe, 10, offset=1)
    assert out["sum"] == 31.0
    ctx0, ctx1 = (v["ctx"] for v in out["views"])
    assert ctx0 == (0, 0, 2, 2, 0, 0) and ctx1 == (1, 1, 2, 2, 0, 0)
    env1 = out["views"][1]["env"]
    assert env1["RANK"] == "1" and env1["WORLD_SIZE"] == "2" and env1["MASTER_ADDR"] == "127.0.0.1"
    assert out["views"][0]["pid"] != out["views"][1]["pid"]
    # Reports reach the driver and are kept in the run's history.
    assert sorted(r["rank"] for r in d.history) == [0, 1] and all(r["total"] == 3.0 for r in d.history)


def test_large_result_comes_back_whole(spark_local):
    def big():
        import numpy as np

        return np.arange(5_000_000, dtype=np.float64)  # 40 MB: several chunks

    out = Distributor(num_processes=2, verbose=False).run(big)
    assert out.shape == (5_000_000,) and out[-1] == 4_999_999


def test_script_runs_as_torchrun_would(spark_local, tmp_path):
    script = tmp_path / "train.py"
    # The barrier: a rank whose init_process_group returned may exit while its peer is still connecting to it,
    # and gloo then fails the peer's init ("Connection closed by peer"; a run of the suite met it), as it would
    # under torchrun.
    script.write_text(textwrap.dedent("""
        import os, sys
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()
        assert sys.argv[1:] == ["--lr=0.1", "x"], sys.argv
        with open(sys.argv[0] + f".rank{os.environ['RANK']}", "w") as f:
            f.write(os.environ["WORLD_SIZE"])
        dist.destroy_process_group()
        if __name__ != "__main__":
            sys.exit(3)
    """))
    assert Distributor(num_processes=2, verbose=False).run(str(script), "--lr=0.1", "x") is None
    assert sorted(p.name for p in tmp_path.iterdir() if ".rank" in p.name) == ["train.py.rank0", "train.py.rank1"]


def test_script_exit_code_is_a_failure(spark_local, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import os, sys\nsys.exit(4 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(str(script))
    assert info.value.rank == 1 and info.value.first.exit_code == 4
    assert "exited with code 4" in str(info.value)


def test_local_mode_runs_processes_on_the_driver(spark_local):
    out = Distributor(num_processes=2, local_mode=True, verbose=False).run(allreduce_and_describe, 1)
    assert out["sum"] == 3.0
    assert {v["pid"] for v in out["views"]}.isdisjoint({os.getpid()})


def hang_unless_rank_one_raises():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError("learning rate must be positive")
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here: its partner never comes
    time.sleep(600)


def test_a_failing_rank_is_reported_within_seconds_while_its_peer_blocks(spark_local):
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(hang_unless_rank_one_raises)
    error = info.value
    # No setting makes it wait: the failure is reported, and rank 0 stopped, within the abort grace period and
    # the slack a loaded machine needs (first runs here import torch) -- not after rank 0's 600 s sleep.
    assert time.monotonic() - started < stop_bound(0) + 10
    assert (error.rank, error.host, error.exc_type) == (1, "127.0.0.1", "ValueError")
    assert isinstance(error.cause, ValueError) and isinstance(error.__cause__, ValueError)
    assert "raise ValueError(\"learning rate must be positive\")" in error.remote_traceback
    assert "rank 1 on host 127.0.0.1 raised ValueError: learning rate must be positive" in str(error)
    # The session stays usable.
    assert Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)["sum"] == 3.0


def killed_by_signal():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    time.sleep(600)


def kill_this_process():  # one rank that dies at once: no torch to import, no peer to abort
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_rank_killed_by_a_signal_is_reported_as_such(spark_local):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(killed_by_signal)
    assert info.value.rank == 1 and info.value.signal == signal.SIGKILL
    assert "rank 1 on host 127.0.0.1 was killed by signal SIGKILL" in str(info.value)
    # The rank killed itself: where the kernel's OOM kills can be counted (a memory cgroup), the error says it was
    # not memory; elsewhere it says what usually sends SIGKILL, the memory settings of where the rank ran.
    counted = oom_kills.count() is not None
    if counted:
        assert "not by the kernel's OOM killer" in str(info.value) and "memoryOverhead" not in str(info.value)
    else:
        assert "this is usually memory" in str(info.value) and "spark.executor.memoryOverhead" in str(info.value)
    # A local-mode rank is a process of the driver: its machine's memory, and the driver's settings.
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=1, local_mode=True, verbose=False).run(kill_this_process)
    assert info.value.rank == 0 and info.value.signal == signal.SIGKILL
    if counted:
        assert "not by the kernel's OOM killer" in str(info.value)
    else:
        assert "the machine running out of memory" in str(info.value) and "spark.driver.memory" in str(info.value)


def test_get_context_outside_a_run_says_where_it_works():
    with pytest.raises(RuntimeError, match="only inside a function run by"):
        get_context()


def test_more_processes_than_slots_fails_before_any_job(spark_local):
    spark_local.conf.set("spark.dist.slotWaitTimeout", "1")
    try:
        jobs_before = jobs_started(spark_local)  # every job, whatever its group (a run's has its own)
        with pytest.raises(ConfigError, match=r"num_processes=3 but the cluster has 2 task slots"):
            Distributor(num_processes=3, verbose=False).run(allreduce_and_describe, 1)
        assert jobs_started(spark_local) == jobs_before
    finally:
        spark_local.conf.unset("spark.dist.slotWaitTimeout")


def test_workers_python_without_spark_dist_is_refused_before_any_job(spark_local, tmp_path, monkeypatch):
    """A session started from a virtual environment's python without activating it: its workers run the
    system's python3 (made here: the base interpreter without site-packages)."""
    python3 = tmp_path / "python3"
    python3.write_text(f"#!/bin/sh\nexec {sys._base_executable} -S \"$@\"\n")
    python3.chmod(0o755)
    monkeypatch.setattr(spark_local.sparkContext, "pythonExec", str(python3))  # what PYSPARK_PYTHON set
    jobs_before = jobs_started(spark_local)
    with pytest.raises(ConfigError) as info:
        Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)
    # spark_dist itself is found there only where it is in the working directory, as it is for this suite
    assert re.match(re.escape(f"the Python workers of this Spark session (local[2]) run '{python3}', and {python3} "
                              "cannot import ") + r"(spark_dist, )?torch\. ", str(info.value)), str(info.value)
    assert f"Set PYSPARK_PYTHON={sys.executable} before the SparkSession starts" in str(info.value)
    assert jobs_started(spark_local) == jobs_before


def test_bad_train_object_is_refused_before_any_job(spark_local, tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        Distributor(num_processes=2).run(str(tmp_path / "missing.py"))
    with pytest.raises(ConfigError, match="must be a function or a path"):
        Distributor(num_processes=2).run(42)
    lock = threading.Lock()
    with pytest.raises(ConfigError, match="cannot be pickled"):
        Distributor(num_processes=2).run(lambda: lock)


def test_two_runs_at_once_each_get_their_own_result(spark_local):
    results = {}

    def launch(scale):
        results[scale] = Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, scale)["sum"]

    threads = [threading.Thread(target=launch, args=(s,)) for s in (1, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {1: 3.0, 100: 300.0}


def test_runs_on_two_executors_of_a_standalone_cluster(spark_standalone):
    out = Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)
    assert out["sum"] == 3.0
    assert [v["ctx"][:3] for v in out["views"]] == [(0, 0, 2), (1, 1, 2)]


def test_a_killed_rank_on_the_standalone_cluster_names_the_rank(spark_standalone):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(killed_by_signal)
    assert info.value.rank == 1 and info.value.signal == signal.SIGKILL
    assert Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)["sum"] == 3.0


def test_the_default_checkpoint_dir_is_flagged_when_executors_are_on_other_hosts():
    # The rule run() applies before warning about the default checkpoint dir (the dataset cache's rule too).
    from spark_dist.data.prepare import remote_hosts

    assert remote_hosts("127.0.0.1", ["127.0.0.1", "localhost"]) == []
    assert remote_hosts("10.0.0.1", ["10.0.0.1", "10.0.0.2"]) == ["10.0.0.2"]


def test_tasks_that_never_meet_are_named_after_the_rendezvous_timeout(spark_local, monkeypatch):
    from spark_dist.driver import attempt as attempt_module
    from spark_dist.task.barrier_task import join_run_store

    real_serve_rank = attempt_module.serve_rank

    def task_one_never_arrives(spec, task, start_child):
        if task.task_index == 0:
            yield from real_serve_rank(spec, task, start_child)
            return
        store = join_run_store(spec)  # it stays away from the store until the driver gives up on it
        while not store.has(ABORT):
            time.sleep(0.05)

    monkeypatch.setattr(attempt_module, "serve_rank", task_one_never_arrives)
    spark_local.conf.set("spark.dist.rendezvousTimeout", "1s")
    started = time.monotonic()
    try:
        # The store's host:port, and what to check when executors cannot reach it (a firewall: pin the port).
        with pytest.raises(TrainingFailedError, match=r"did not all start within spark\.dist\.rendezvousTimeout=1s "
                                                      r"\(tasks that never reached the run's store at "
                                                      r"127\.0\.0\.1:(\d+): 1\)\. If they ran, check that every "
                                                      r"executor can reach 127\.0\.0\.1:\1: a firewall.*"
                                                      r"spark\.dist\.storePort.*spark\.driver\.host"):
            Distributor(num_processes=2, local_mode=True, verbose=False, spark=spark_local).run(os.getpid)
    finally:
        spark_local.conf.unset("spark.dist.rendezvousTimeout")
    assert time.monotonic() - started < stop_bound(1)  # the rendezvous timeout, then the abort grace period


def gloo_interfaces():
    return {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")}


def test_gloo_uses_the_interface_of_the_tasks_spark_address(spark_local):
    # Where the host name resolves to 127.0.0.1 (containers), gloo's own pick breaks the mesh across hosts.
    assert Distributor(num_processes=2, verbose=False).run(gloo_interfaces) == {
        "GLOO_SOCKET_IFNAME": "lo", "HOROVOD_GLOO_IFACE": "lo"}


def test_the_users_gloo_interface_wins(monkeypatch):
    from spark_dist.wire.ranks import with_gloo_interface

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    assert with_gloo_interface({"RANK": "0"}, "127.0.0.1") == {"RANK": "0", "HOROVOD_GLOO_IFACE": "lo"}
    assert with_gloo_interface({"RANK": "0"}, "192.0.2.99") == {"RANK": "0"}  # no interface holds it


# -- history, cancellation from outside, the Spark UI's description ---------------------------------------------
def report_three_epochs():
    ctx = get_context()
    for epoch in range(3):
        ctx.report(epoch=epoch, loss=1.0 / (epoch + 1))


def test_the_history_is_a_frame_ready_to_plot(spark_local):
    d = Distributor(num_processes=2, verbose=False)
    d.run(report_three_epochs)
    frame = d.history_frame()
    assert len(frame) == 6 and {"rank", "attempt", "time", "epoch", "loss"} <= set(frame.columns)
    assert str(frame["time"].dtype).startswith("datetime64") and set(frame["attempt"]) == {0}
    rank0 = frame[frame["rank"] == 0].sort_values("epoch")
    assert rank0["loss"].tolist() == [1.0, 0.5, 1.0 / 3]


def record_pid_and_wait(pid_dir):
    open(os.path.join(pid_dir, f"rank{get_context().rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)


def test_cancelling_the_job_group_from_outside_ends_the_run_cleanly(spark_local, tmp_path):
    import threading

    from pyspark import SparkContext

    sc = SparkContext._active_spark_context

    def cancel_when_both_ranks_run():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        sc.cancelJobGroup("spark_dist-cancel-me-0")  # what the UI's kill link or a user's code does

    threading.Thread(target=cancel_when_both_ranks_run, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, max_retries=2, verbose=False, run_id="cancel-me").run(
            record_pid_and_wait, str(tmp_path))
    assert info.value.first.kind == "cancelled" and info.value.attempts == 1  # not retried
    assert time.monotonic() - started < 60
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2 and still_running_after(pids) == []


def traceback_variable():
    return os.environ.get("SPARK_SIMPLIFIED_TRACEBACK")


def test_a_classic_runs_barrier_stage_is_a_sql_job_named_for_the_run(spark_local):
    """The launch is a mapInArrow job: its tasks are the SQL runner's Python workers (the variable SQL adds to
    their environment reaches the ranks) without touching the session's ``sc.environment``, and the Spark UI
    shows the job, in the run's job group, under the run's description."""
    from clusters import _wait_for

    sc = spark_local.sparkContext
    environment = dict(sc.environment)
    assert "SPARK_SIMPLIFIED_TRACEBACK" not in environment
    assert Distributor(num_processes=2, verbose=False, run_id="sql-stage").run(traceback_variable) == "1"
    assert sc.environment == environment
    jobs = sc.statusTracker().getJobIdsForGroup("spark_dist-sql-stage-0")
    assert len(jobs) == 1
    ui = sc._jsc.sc().statusStore()  # the listener bus fills the UI's stores shortly after the job
    description = _wait_for("the job's description", lambda: ui.job(jobs[0]).description().getOrElse(None), 30)
    assert description == "spark_dist run sql-stage attempt 0: 2 ranks, ddp"

    def our_sql_execution():
        executions = spark_local._jsparkSession.sharedState().statusStore().executionsList()
        return next((executions.apply(i) for i in range(executions.size())
                     if executions.apply(i).jobs().contains(jobs[0])), None)

    execution = _wait_for("the SQL execution that ran the job", our_sql_execution, 30)
    assert "MapInArrow" in execution.physicalPlanDescription()


def test_the_spark_ui_names_the_run(spark_local):
    from spark_dist.config import RunConfig

    config = RunConfig.build(num_processes=2, backend="horovod", run_id="r1")
    assert config.job_description(1) == "spark_dist run r1 attempt 1: 2 ranks, horovod"
