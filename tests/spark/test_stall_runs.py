"""A run whose ranks are alive but make no step: the driver diagnoses it from every rank's stack within
``spark.dist.stallTimeout``, naming the rank behind and the line it waits in, and by ``spark.dist.stallAction``
warns (the run goes on) or fails it (``RunStalledError``, with the stacks). A loader that is slow but moving is
never a stall. A rank slower than its peers is named in the summary as a straggler, with where its time went."""
import inspect
import os
import time

import pytest

pytest.importorskip("torch")
from spark_dist import Distributor  # noqa: E402
from spark_dist.config import CONF_STALL_ACTION, CONF_STALL_TIMEOUT  # noqa: E402
from spark_dist.driver.summary import stragglers  # noqa: E402
from spark_dist.errors import RunStalledError  # noqa: E402

STALL_S = 2.5


def all_reduce_steps(marker, behind, hold, steps=8):
    """A step is an all-reduce (marked with ctx.step()); rank ``behind`` blocks before its 4th for ``hold``."""
    import threading

    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    total = torch.ones(1)
    for step in range(steps):
        if step == 3 and ctx.rank == behind:
            with open(marker, "w") as f:
                f.write(str(time.time()))
            threading.Event().wait(hold)  # the rank behind waits here
        dist.all_reduce(total)
        ctx.step()
    return total.item()


BLOCKED_LINE = next(i for i, line in enumerate(inspect.getsourcelines(all_reduce_steps)[0],
                                               start=all_reduce_steps.__code__.co_firstlineno)
                    if "the rank behind waits here" in line)


@pytest.fixture
def stall_conf(spark_local):
    spark_local.conf.set(CONF_STALL_TIMEOUT, f"{STALL_S}s")
    yield spark_local
    for key in (CONF_STALL_TIMEOUT, CONF_STALL_ACTION):
        spark_local.conf.unset(key)


@pytest.mark.skipif(not __import__("pyspark").__version__.startswith("3.5"),
                    reason="local mode, no Spark job: the 3.5 line's suite runs it")
def test_a_rank_blocked_before_an_all_reduce_is_named_with_its_line_and_the_run_goes_on(
        stall_conf, tmp_path, capsys):
    d = Distributor(num_processes=4, local_mode=True, log_ranks="none")
    assert d.run(all_reduce_steps, str(tmp_path / "blocked"), 2, STALL_S + 7) == 4.0 ** 8
    [diagnosis] = d.stalls
    assert diagnosis.behind == [2]
    where = f"test_stall_runs.py:{BLOCKED_LINE} (all_reduce_steps)"
    assert where in diagnosis.lines()[1] and diagnosis.lines()[1].startswith("  rank 2 (on ")
    assert "ranks 0, 1, 3" in diagnosis.lines()[2]
    printed = capsys.readouterr().out
    assert printed.count("no rank has finished a step for") == 1 and where in printed


def test_stall_action_fail_ends_the_run_within_the_timeout_with_every_ranks_stack(stall_conf, tmp_path):
    stall_conf.conf.set(CONF_STALL_ACTION, "fail")
    marker = tmp_path / "blocked"
    with pytest.raises(RunStalledError) as caught:
        Distributor(num_processes=2, verbose=False).run(all_reduce_steps, str(marker), 1, 600)
    took = time.time() - float(marker.read_text())
    assert took < STALL_S + 10
    first, other = caught.value.failures_list[:2]
    assert (first.rank, first.kind, other.rank) == (1, "stalled", 0)
    assert f"test_stall_runs.py:{BLOCKED_LINE} (all_reduce_steps)" in first.message
    assert "all_reduce" in other.traceback and "in child_main" in first.traceback  # each rank's whole stack
    assert "rank 1" in str(caught.value)


def slow_batches(batch):
    time.sleep(0.8)  # every heartbeat (1 s) sees a new step: the watch moves no slower than 1.5 s
    return batch


def read_slowly(epochs=1):
    from spark_dist import get_context

    ctx = get_context()
    for batch in ctx.loader("train", batch_size=8, transform=slow_batches):
        pass
    return ctx.rank


def test_a_slow_but_moving_loader_is_never_a_stall(stall_conf):
    d = Distributor(num_processes=2, verbose=False)
    assert d.run(read_slowly, datasets={"train": stall_conf.range(64)}) == 0  # 4 batches a rank, 0.8 s each
    assert d.stalls == []


def slower_rank(slow_rank, steps=15):
    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    for _ in range(steps):
        end = time.perf_counter() + (0.06 if ctx.rank == slow_rank else 0.01)
        while time.perf_counter() < end:  # compute
            pass
        dist.all_reduce(torch.ones(1))
        ctx.step()
    return os.getpid()


def test_a_rank_slower_than_its_peers_is_named_a_straggler_and_nobody_in_an_even_run(spark_local, capsys):
    d = Distributor(num_processes=2)
    d.run(slower_rank, 1)
    [line] = stragglers(d.input_stats)
    assert line.startswith("rank 1 on ") and "most of it computing" in line
    assert line in capsys.readouterr().out  # the summary says it
    d.run(slower_rank, None)
    assert stragglers(d.input_stats) == []
