"""spark_dist.task.child_process: how a task starts its rank. Forking the warm Python worker is the fast path; a worker
where forking is unsafe spawns a fresh interpreter instead."""
import os
import sys
import tempfile

import pytest
import torch

from clusters import _wait_for
from spark_dist import Distributor
from spark_dist.task import barrier_task, warm_imports, child_process as worker


def test_a_worker_that_initialised_cuda_spawns_its_rank(monkeypatch):
    spawned = []
    monkeypatch.setattr(worker, "spawn_child", lambda *args: spawned.append(args) or "spawned")
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    # No GPU here: CUDA's "initialised" state stands in for a worker where a GPU transform ran.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert worker._unsafe_to_fork()
    assert worker.fork_child("spec", "rank", {}, "workdir") == "spawned"
    assert spawned == [("spec", "rank", {}, "workdir")]


def test_a_worker_forks_its_ranks_with_or_without_torch_dynamo(monkeypatch):
    # Ranks forked from a worker holding torch._dynamo used to hang at exit now and then; that was torch's gloo
    # teardown, which spark_dist.task.teardown keeps ranks out of (tests/test_teardown.py), so they fork too.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert not worker._unsafe_to_fork()
    monkeypatch.setitem(sys.modules, "torch._dynamo", object())
    assert not worker._unsafe_to_fork()


def what_the_rank_started_with():
    return {"worker": os.getppid(), "warm": all(m in sys.modules for m in warm_imports.WARM_MODULES),
            "dynamo": "torch._dynamo" in sys.modules}


def test_a_worker_whose_ranks_trained_forks_later_ranks_with_torch_dynamo(spark_local):
    # torch.optim's first step imports torch._dynamo (~1.5-2 s a rank here); after a run whose ranks did, it is
    # imported into the idle worker, so later ranks start with it.
    trained_in, seen = set(), []
    for _ in range(3):
        for rank in Distributor(num_processes=2, verbose=False).run(_report_then_train):
            seen.append((rank["worker"] in trained_in, rank["warm"], rank["dynamo"]))
            trained_in.add(rank["worker"])
    assert any(reused for reused, _, _ in seen)  # local[2] reuses its Python workers
    assert all(warm and dynamo for reused, warm, dynamo in seen if reused)


def _report_then_train():
    """Every rank's state at its start; then one optimizer step (which imports torch._dynamo)."""
    import torch.distributed as dist

    state = what_the_rank_started_with()
    dist.init_process_group("gloo")
    try:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, state)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        return everyone
    finally:
        dist.destroy_process_group()


def test_a_fork_lifts_the_warm_up_off_the_lowest_priority_before_waiting_for_it(monkeypatch, tmp_path):
    # The warm-up imports at nice 19 while the worker idles; a fork that needs them must not wait at that
    # priority (~1.5% of a core on a busy machine). The stand-in module takes 0.5 s, then records its nice.
    if not warm_imports.may_lift_priority_to(os.getpriority(os.PRIO_PROCESS, 0)):
        pytest.skip("this process may not lower a thread's nice value (no CAP_SYS_NICE, RLIMIT_NICE 0)")
    (tmp_path / "slow_warm_module.py").write_text(
        "import os, threading, time\n"
        "STARTED_AT = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "time.sleep(0.5)\n"
        "ENDED_AT = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(warm_imports, "WARM_MODULES", ("slow_warm_module",))
    monkeypatch.setattr(warm_imports, "_warming", None)
    monkeypatch.setattr(warm_imports, "_warming_lifted", False)
    warm_imports.warm_for_next_run()
    # Wait until the import is under way (at the lowest priority): on a busy machine the thread may not have
    # started within a fixed sleep (0.2 s failed once, with both lines' suites on 2 cores), and a fork arriving
    # first rightly keeps the warm-up at the caller's priority, which is not what this test is about.
    _wait_for("the warm-up's import to start", lambda: hasattr(sys.modules.get("slow_warm_module"), "STARTED_AT"),
              30, interval=0.01)
    warm_imports.warmed()
    module = sys.modules.pop("slow_warm_module")
    assert (module.STARTED_AT, module.ENDED_AT) == (19, os.getpriority(os.PRIO_PROCESS, 0))


def register_exit_work(marker, crash):
    import atexit

    from spark_dist import get_context

    rank = get_context().rank

    def on_exit():
        with open(f"{marker}.{rank}", "w") as f:  # as an MLflow or TensorBoard finaliser would
            f.write("flushed")
        if crash:
            os.abort()  # a library crashing at interpreter exit (gloo without destroy_process_group)

    atexit.register(on_exit)
    return "trained"


@pytest.mark.parametrize("local_mode", [False, True], ids=["spark-task", "local-mode"])
def test_a_ranks_exit_handlers_run_and_a_crash_after_the_result_is_a_warning(spark_local, tmp_path, local_mode,
                                                                            capfd):
    marker = str(tmp_path / "exit")
    d = Distributor(num_processes=2, local_mode=local_mode, verbose=False)
    assert d.run(register_exit_work, marker, False) == "trained"
    assert sorted(os.listdir(tmp_path)) == ["exit.0", "exit.1"]  # every rank ran its own exit handlers
    assert d.run(register_exit_work, marker, True) == "trained"  # the result had arrived: kept
    if local_mode:  # ranks on the driver: their supervisor's warning is on the driver's stderr
        assert "after delivering its result; the result is kept" in capfd.readouterr().err


def test_a_task_whose_second_rank_fails_to_start_reaps_the_first_and_leaves_no_work_dir(tmp_path, monkeypatch):
    from spark_dist.wire.protocol import LaunchSpec, SlotAssignment, assignment_key
    from spark_dist.wire.ranks import RankInfo, TaskInfo
    from spark_dist.wire.sealed_store import SealedStore, host_store

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the task makes its ranks' work dirs
    server, port = host_store("127.0.0.1", 10.0)
    spec = LaunchSpec(run_id="start-fails", attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=b"s" * 32, rendezvous_timeout=10.0)
    driver = SealedStore(server, spec.secret, spec.prefix)
    slots = [TaskInfo(i, "127.0.0.1", (), "", 0) for i in range(2)]
    driver.put_many({assignment_key(i): SlotAssignment(RankInfo(i, i, 2, 2, 0, 1, "127.0.0.1"), {})
                     for i in range(2)})
    started = []

    def start_child(spec, rank, env, workdir):
        if rank.rank == 1:
            raise OSError("no more processes")
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a rank that would run for ten minutes, killed before it leads its own process group
            os.execvp("sleep", ["sleep", "600"])
        os.close(out_write)
        os.close(err_write)
        started.append(pid)
        return worker.ChildProcess(pid, out_read, err_read)

    with pytest.raises(OSError, match="no more processes"):
        list(barrier_task.serve_task(spec, slots, start_child))
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left in this long-lived worker
        os.waitpid(started[0], os.WNOHANG)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("spark_dist-rank-")] == []
