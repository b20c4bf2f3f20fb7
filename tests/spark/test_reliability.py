"""Retries resume from checkpoints; hung ranks, killed ranks and lost workers end cleanly and say who."""
import glob
import os
import signal
import socket
import tempfile
import time

import psutil
import pytest

from clusters import still_running_after
from spark_dist import Distributor, RunTimeoutError, TrainingFailedError, get_context


def simple_sum():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return float(t)


def hang_on_rank_one():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(600)  # never joins the all-reduce
    dist.all_reduce(torch.ones(1))


# What the ranks' teardown and Spark's end of a job may take on a loaded machine (two cores, both Spark lines'
# suites at once), on top of what the settings allow: a bound that still tells "stopped" from "waited for the
# hung rank" (which sleeps 600 s).
TEARDOWN_SLACK_S = 30


def stop_bound(wait):
    """The longest a run may take to end once it has waited ``wait`` seconds by its settings (a timeout, a
    rendezvous timeout): then the abort grace period its ranks get to stop, then :data:`TEARDOWN_SLACK_S`."""
    from spark_dist.config import RunConfig

    return wait + RunConfig.build(num_processes=2).abort_grace_period + TEARDOWN_SLACK_S


def test_timeout_names_the_rank_that_stopped_answering(spark_local):
    # Warm Python workers first: the timeout below measures the hang, not torch's first import.
    Distributor(num_processes=2, verbose=False).run(simple_sum)
    started = time.monotonic()
    with pytest.raises(RunTimeoutError) as info:
        Distributor(num_processes=2, timeout=8, verbose=False).run(hang_on_rank_one)
    assert time.monotonic() - started < stop_bound(8)
    error = info.value
    assert error.rank == 1
    text = str(error)
    assert "rank 1 on host 127.0.0.1 stopped answering (the run exceeded timeout=8s): at File" in text
    assert "in hang_on_rank_one" in text
    assert "rank 0 on host 127.0.0.1 was waiting in a collective" in text


def fail_once(marker_dir):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ctx = get_context()
    if ctx.attempt == 0 and ctx.rank == 1:
        raise ConnectionError("flaky network on the first attempt")
    t = torch.ones(1)
    dist.all_reduce(t)
    return (ctx.attempt, float(t))


def test_a_rank_that_fails_once_is_retried_with_a_new_attempt(spark_local):
    d = Distributor(num_processes=2, max_retries=2, verbose=False)
    assert d.run(fail_once, None) == (1, 2.0)


def same_bug_everywhere():
    raise KeyError("missing_column")


def test_the_same_error_on_every_rank_is_not_retried(spark_local):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, max_retries=3, verbose=False).run(same_bug_everywhere)
    assert info.value.attempts == 1 and info.value.exc_type == "KeyError"


def allocate_too_much_on_rank_one():
    import torch

    if get_context().rank == 1:
        torch.empty(10 ** 13)  # 37 TiB of float32: the host's allocator refuses it
    return "done"


def test_a_rank_out_of_memory_is_named_with_the_size_and_not_retried(spark_local):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, max_retries=2, verbose=False).run(allocate_too_much_on_rank_one)
    assert info.value.attempts == 1 and info.value.rank == 1
    assert "rank 1 on host 127.0.0.1 ran out of host memory asking for 36.38 TiB" in str(info.value)
    assert "Not retried" in str(info.value)


def train_with_checkpoints(epochs, crash_at_epoch):
    """Deterministic DDP training that checkpoints every epoch; rank 1 is SIGKILLed once at crash_at_epoch."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    ctx = get_context()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = ctx.load_checkpoint(default={"epoch": 0})
    if "model" in state:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    data = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 4, generator=data), torch.randn(64, 1, generator=data)
    for epoch in range(state["epoch"], epochs):
        if epoch == crash_at_epoch and ctx.attempt == 0 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        shard = slice(ctx.rank * 32, (ctx.rank + 1) * 32)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        optimizer.step()
        ctx.save_checkpoint({"epoch": epoch + 1, "model": model.module.state_dict(),
                             "optimizer": optimizer.state_dict()})
        dist.barrier()  # the checkpoint of this epoch is written before anyone moves on
    return {"weights": model.module.weight.detach().clone(), "attempt": ctx.attempt, "started_at": state["epoch"]}


def test_a_killed_rank_resumes_from_its_checkpoint_with_identical_weights(spark_local, tmp_path):
    clean = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "clean"))
    expected = clean.run(train_with_checkpoints, 6, None)
    resumed = Distributor(num_processes=2, max_retries=1, verbose=False, checkpoint_dir=str(tmp_path / "crash"))
    out = resumed.run(train_with_checkpoints, 6, 3)
    # The retry went on from the checkpoint of epoch 3, not from scratch (which, as deterministic as this
    # training is, would end with the same weights).
    assert out["attempt"] == 1 and out["started_at"] == 3 and expected["attempt"] == 0
    assert expected["started_at"] == 0 and out["weights"].equal(expected["weights"])


def test_the_same_run_id_resumes_an_earlier_run(spark_local, tmp_path):
    first = Distributor(num_processes=2, verbose=False, run_id="resume-me", checkpoint_dir=str(tmp_path))
    with pytest.raises(TrainingFailedError):
        first.run(train_with_checkpoints, 6, 3)  # no retries: the run stops at epoch 3
    assert os.path.exists(tmp_path / "resume-me" / "checkpoint.pt")  # each run in <dir>/<run_id>/
    again = Distributor(num_processes=2, verbose=False, run_id="resume-me", checkpoint_dir=str(tmp_path))
    expected = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "x")).run(
        train_with_checkpoints, 6, None)
    resumed = again.run(train_with_checkpoints, 6, None)
    assert resumed["started_at"] == 3 and resumed["weights"].equal(expected["weights"])


def test_a_new_run_never_resumes_another_runs_checkpoints(spark_local, tmp_path):
    spark_local.conf.set("spark.dist.checkpointDir", str(tmp_path))  # as the cluster templates set it
    try:
        first = Distributor(num_processes=2, verbose=False)
        first.run(train_with_checkpoints, 4, None)
        second = Distributor(num_processes=2, verbose=False)
        out = second.run(train_with_checkpoints, 4, None)
    finally:
        spark_local.conf.unset("spark.dist.checkpointDir")
    assert out["started_at"] == 0  # trained every epoch itself
    assert first.last_run_id != second.last_run_id
    assert sorted(os.listdir(tmp_path)) == sorted([first.last_run_id, second.last_run_id])


def record_pid_then_block(pid_dir):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    # The work dirs of this run as the leftover check below looks for them: it must see them while they exist.
    seen = [os.path.basename(p) for p in rank_work_dirs(get_context().run_id)]
    open(os.path.join(pid_dir, f"rank{dist.get_rank()}.dirs"), "w").write("\n".join(seen))
    open(os.path.join(pid_dir, f"rank{dist.get_rank()}.pid"), "w").write(str(os.getpid()))
    if dist.get_rank() == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    time.sleep(600)


def rank_work_dirs(run_id, parent=None):
    """The work dirs of ``run_id``'s ranks in ``parent`` (the temp dir of the tests and of every process they
    start): ``spark_dist-rank-<pid>-<run_id>-<attempt>-r<rank>-XXXX`` (spark_dist.task.barrier_task, made by
    spark_dist.host.tempdirs)."""
    return glob.glob(os.path.join(parent or tempfile.gettempdir(), f"spark_dist-rank-*-{glob.escape(run_id)}-*"))


def _leftovers(*run_ids, timeout=20):
    """The rank work dirs of ``run_ids`` still there once they are gone or ``timeout`` seconds passed: a task
    being cancelled removes its dirs a little after ``run()`` has raised."""
    deadline = time.monotonic() + timeout
    while True:
        left = [path for run_id in run_ids for path in rank_work_dirs(run_id)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_after_a_failure_no_rank_process_or_temp_dir_is_left(spark_local, tmp_path):
    d = Distributor(num_processes=2, verbose=False)
    with pytest.raises(TrainingFailedError):
        d.run(record_pid_then_block, str(tmp_path))
    pids = [int(open(tmp_path / f"rank{r}.pid").read()) for r in (0, 1)]
    seen = {r: (tmp_path / f"rank{r}.dirs").read_text().split() for r in (0, 1)}
    # While the ranks ran, each saw both ranks' work dirs (one machine, one temp dir): the check below can fail.
    assert all(sorted(n.rsplit("-", 2)[1] for n in names) == ["r0", "r1"] for names in seen.values()), seen
    assert still_running_after(pids) == []
    assert _leftovers(d.last_run_id) == []


def _listening_ports():
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_ten_runs_back_to_back_leave_nothing_behind(spark_local):
    ports_before = _listening_ports()
    d = Distributor(num_processes=2, verbose=False)
    run_ids = []
    for _ in range(10):
        assert d.run(simple_sum) == 1.0
        run_ids.append(d.last_run_id)
    assert len(set(run_ids)) == 10
    assert _listening_ports() <= ports_before  # every run's store port is closed
    assert _leftovers(*run_ids) == []


def poke_the_store_then_sum():
    """Rank 0 plays a stranger on the run's store: garbage bytes, then a forged abort key."""
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        with socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))) as s:
            s.sendall(os.urandom(256))
        stranger = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
        run = get_context()
        stranger.set(f"spark_dist/{run.run_id}/{run.attempt}/abort", b"x" * 40)
        time.sleep(0.5)  # the supervisors poll the abort key meanwhile
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def test_forged_connections_and_values_do_not_disturb_a_run(spark_local):
    assert Distributor(num_processes=2, verbose=False).run(poke_the_store_then_sum) == 2.0


def forge_a_report_slot_then_report():
    """Rank 0 plays a stranger: it takes a report number and writes a forged value there, then reports."""
    from torch.distributed import TCPStore

    run = get_context()
    if run.rank == 0:
        stranger = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
        prefix = f"spark_dist/{run.run_id}/{run.attempt}"
        taken = stranger.add(f"{prefix}/report_seq", 1)
        stranger.set(f"{prefix}/report/{taken}", b"x" * 40)
        stranger.add(f"{prefix}/report_seq", 1)  # and one number it never writes
    time.sleep(0.5)
    for step in range(3):
        run.report(step=step)
    time.sleep(3)  # longer than the driver waits for an empty slot
    return "done"


def test_a_forged_report_does_not_hide_the_real_ones(spark_local):
    d = Distributor(num_processes=2, verbose=False)
    assert d.run(forge_a_report_slot_then_report) == "done"
    assert sorted((r["rank"], r["step"]) for r in d.history if "step" in r) == [
        (rank, step) for rank in (0, 1) for step in range(3)]


def kill_my_python_worker():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if get_context().attempt == 0 and dist.get_rank() == 1:
        os.kill(os.getppid(), signal.SIGKILL)  # the executor's Python worker that supervises this rank
        time.sleep(600)
    t = torch.ones(1)
    dist.all_reduce(t)
    return (get_context().attempt, float(t))


def test_a_killed_python_worker_is_retried_on_the_standalone_cluster(spark_standalone):
    assert Distributor(num_processes=2, max_retries=1, verbose=False).run(kill_my_python_worker) == (1, 2.0)


def test_a_killed_python_worker_without_retries_names_the_rank(spark_standalone):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(kill_my_python_worker)
    assert info.value.first.kind == "lost" and info.value.rank == 1
    assert "Python worker exited unexpectedly" in str(info.value)


def listeners_seen_by_a_rank():
    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    store_port = int(os.environ["MASTER_PORT"])
    mine = [c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    store = [c.laddr.ip for c in psutil.net_connections("tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.port == store_port]
    return {"rank": mine, "store": store}


def test_every_listener_of_a_run_binds_the_spark_host_address(spark_local):
    seen = Distributor(num_processes=2, verbose=False).run(listeners_seen_by_a_rank)
    assert seen["store"] == ["127.0.0.1"]  # the driver's store: spark.driver.host, not 0.0.0.0
    assert seen["rank"] and set(seen["rank"]) == {"127.0.0.1"}  # gloo's own listeners in the rank


def kill_my_executor_once():
    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ctx = get_context()
    if ctx.attempt == 0 and ctx.rank == 1:
        # This rank's supervisor is a Python worker; its parent the PySpark daemon; above it the executor JVM.
        executor = psutil.Process(os.getppid()).parent().parent()
        assert "CoarseGrainedExecutorBackend" in " ".join(executor.cmdline())
        executor.kill()
        time.sleep(600)
    t = torch.ones(1)
    dist.all_reduce(t)
    return (ctx.attempt, float(t))


def test_a_lost_executor_is_survived_by_a_retry(spark_standalone):
    started = time.monotonic()
    assert Distributor(num_processes=2, max_retries=1, verbose=False).run(kill_my_executor_once) == (1, 2.0)
    assert time.monotonic() - started < 120


def kill_the_executor_of_rank_1(executor_dir):
    import psutil
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = get_context().rank
    executor = psutil.Process(os.getppid()).parent().parent()  # as in kill_my_executor_once
    assert "CoarseGrainedExecutorBackend" in " ".join(executor.cmdline())
    with open(os.path.join(executor_dir, f"rank{rank}"), "w") as f:
        f.write(str(executor.pid))
    dist.barrier()  # every rank wrote down its executor
    if rank == 1:
        executor.kill()
    time.sleep(600)


def test_a_lost_executor_names_every_rank_it_ran(spark_shared_executors, tmp_path):
    # Spark reports the barrier task that failed the stage: one of the executor's two ranks.
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=4, verbose=False).run(kill_the_executor_of_rank_1, str(tmp_path))
    executors = {int(p.name[4:]): p.read_text() for p in tmp_path.iterdir()}
    on_it = sorted(r for r, pid in executors.items() if pid == executors[1])
    assert len(executors) == 4 and len(on_it) == 2
    lost = sorted(r for r, f in info.value.failures.items() if f.kind == "lost")
    assert lost == on_it, str(info.value)
    assert "was lost: ExecutorLostFailure" in info.value.first.message


def record_pid_and_sleep(pid_dir):
    open(os.path.join(pid_dir, f"rank{get_context().rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)


def test_ctrl_c_on_the_driver_stops_the_ranks_and_the_job(spark_local, tmp_path):
    from spark_jobs import interrupt_main_when

    d = Distributor(num_processes=2, verbose=False)
    with interrupt_main_when(tmp_path, "rank*.pid", 2, timeout=60) as ctrl_c:  # once both ranks run
        with pytest.raises(KeyboardInterrupt):
            d.run(record_pid_and_sleep, str(tmp_path))
    assert ctrl_c.fired
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2
    assert still_running_after(pids) == []  # the ranks' supervisors kill them once they see the abort key
    # Cancelling the job kills the Python workers that supervised the ranks (Spark's SIGKILL: no clean-up), and
    # their work dirs with them are left to the next run on the machine, which sweeps them
    # (docs/how_a_run_works.md, "Clean-up"); a dir still held by a live process would not be swept.
    assert Distributor(num_processes=2, verbose=False).run(simple_sum) == 1.0  # the session still works
    assert _leftovers(d.last_run_id) == []


# -- the same failures on the standalone cluster: ranks on two executors of their own ------------------------
def test_standalone_a_killed_rank_resumes_from_its_checkpoint(spark_standalone, tmp_path):
    test_a_killed_rank_resumes_from_its_checkpoint_with_identical_weights(spark_standalone, tmp_path)


def test_standalone_a_rank_that_fails_once_is_retried(spark_standalone):
    test_a_rank_that_fails_once_is_retried_with_a_new_attempt(spark_standalone)


def test_standalone_timeout_names_the_hung_rank(spark_standalone):
    test_timeout_names_the_rank_that_stopped_answering(spark_standalone)


def test_standalone_two_runs_at_once_and_forged_store_values(spark_standalone):
    import threading

    results = {}

    def launch(name, fn):
        results[name] = Distributor(num_processes=2, verbose=False).run(fn)

    threads = [threading.Thread(target=launch, args=("sum", simple_sum)),
               threading.Thread(target=launch, args=("poked", poke_the_store_then_sum))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert results == {"sum": 1.0, "poked": 2.0}


def test_standalone_no_rank_process_or_temp_dir_is_left_after_a_failure(spark_standalone, tmp_path):
    test_after_a_failure_no_rank_process_or_temp_dir_is_left(spark_standalone, tmp_path)


def record_my_executor_then_wait(executor_dir):
    """Rank 1 of the first attempt writes down its executor's pid and waits (for the test to take its machine
    away); every other rank of any attempt returns at once."""
    import psutil

    ctx = get_context()
    if ctx.attempt == 0 and ctx.rank == 1:
        executor = psutil.Process(os.getppid()).parent().parent()  # as in kill_my_executor_once
        assert "CoarseGrainedExecutorBackend" in " ".join(executor.cmdline())
        with open(os.path.join(executor_dir, "executor.pid"), "w") as f:
            f.write(str(executor.pid))
        time.sleep(600)
    return "ok"


def test_a_retry_waits_for_the_lost_executor_and_keeps_the_failure_standalone(spark_standalone, standalone_cluster,
                                                                               tmp_path):
    """A worker and its executor go for good while the run runs (a machine lost, never replaced): the retry
    waits spark.dist.retrySlotWaitTimeout for the cluster to replace it, then gives up with a ConfigError naming
    the key, whose cause is the first attempt's failure. The standalone cluster is left with one worker: the next
    test that asks for it gets a new one (SparkManager.standalone)."""
    import threading

    from spark_dist import ConfigError

    lost = {}

    def take_the_machine_of_rank_1_away():
        pid_file, deadline = tmp_path / "executor.pid", time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written
        if pid_file.exists():
            executor = int(pid_file.read_text())
            [worker] = [i for i in range(len(standalone_cluster.workers))
                        if executor in standalone_cluster.executor_pids(worker=i)]
            lost["worker"], lost["at"] = worker, time.monotonic()
            standalone_cluster.kill_worker(worker)

    thread = threading.Thread(target=take_the_machine_of_rank_1_away, daemon=True)
    thread.start()
    spark_standalone.conf.set("spark.dist.retrySlotWaitTimeout", "8s")
    try:
        with pytest.raises(ConfigError, match=r"spark\.dist\.retrySlotWaitTimeout") as info:
            Distributor(num_processes=2, max_retries=1, verbose=False).run(record_my_executor_then_wait,
                                                                           str(tmp_path))
        given_up = time.monotonic()
    finally:
        spark_standalone.conf.unset("spark.dist.retrySlotWaitTimeout")
        thread.join(130)
    assert "worker" in lost, "rank 1 never wrote down its executor"
    assert given_up - lost["at"] >= 8  # it waited the retry's whole slot wait for a replacement
    message = str(info.value)
    assert "after waiting 8s for the cluster to replace lost executors" in message, message
    assert "but the cluster has 1 task slots" in message, message
    cause = info.value.__cause__
    assert isinstance(cause, TrainingFailedError) and cause.rank == 1 and cause.first.kind == "lost", str(cause)
