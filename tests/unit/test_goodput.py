"""A run's time split into parts that add up to its wall time, attempt by attempt (spark_dist.driver.goodput),
from what the driver noted and the ranks' clocks; no JVM. A real run's split: tests/spark/test_goodput.py."""
import pyspark
import pytest

from spark_dist.driver.goodput import PARTS, AttemptTimes, line, recovery_seconds, split, totals

# A local-mode run touches no Spark: the 3.5 line's suite runs it (the same torch on both lines).
ONE_LINE = pytest.mark.skipif(not pyspark.__version__.startswith("3.5"), reason="run on the 3.5 line's suite")


def clock(start, group, first_step, data, stall, end=0.0, last_checkpoint=0.0, data_then=0.0, stall_then=0.0):
    return {"function_start": start, "group_start": start, "group_end": start + group, "first_step": first_step,
            "data_wait": data, "checkpoint_stall": stall, "last_checkpoint": last_checkpoint,
            "data_wait_at_checkpoint": data_then, "checkpoint_stall_at_checkpoint": stall_then,
            "function_end": end}


def test_a_failed_attempt_loses_its_work_after_its_last_checkpoint_and_the_next_pays_the_recovery():
    failed = AttemptTimes(0, 2, "failed", queued_at=101.0, submitted_at=101.5, ended_at=131.0, failed_at=130.0,
                          clocks={0: clock(103.0, 1.0, 105.0, data=2.0, stall=1.0, last_checkpoint=120.0,
                                           data_then=1.5, stall_then=1.0),
                                  1: clock(104.0, 0.0, 0, 0, 0)})
    retried = AttemptTimes(1, 2, "succeeded", queued_at=135.0, submitted_at=135.0, ended_at=150.0,
                           clocks={0: clock(137.0, 0.5, 140.0, data=1.0, stall=0.0, end=149.0),
                                   1: clock(137.5, 0.5, 0, 0, 0, end=149.0)})
    first, second = split(100.0, 151.0, [failed, retried])
    assert first["setup"] == 1.0 and first["slots"] == 0.5 and first["launch"] == 2.5  # until rank 1 came
    assert first["process_group"] == 0.0  # rank 0 set its group up while rank 1 was still launching
    assert first["lost_work"] == 9.5  # 120 -> 130, less the 0.5 s waited for data since
    assert first["training"] == 26.0 - 2.0 - 1.0 - 9.5 and first["teardown"] == 0.0
    assert second["recovery"] == 5.0 and second["launch"] == 2.5 and second["process_group"] == 0.0
    assert second["teardown"] == 2.0  # 149 -> 150, and the driver's own end 150 -> 151
    assert sum(r["wall"] for r in (first, second)) == 51.0  # the run's wall time, every second in one part
    assert recovery_seconds([failed, retried]) == 10.0  # the abort at 130 -> the first step at 140
    total = totals([first, second])
    assert total["wall"] == 51.0 and total["goodput"] == round(total["training"] / 51.0, 4)
    assert line([first, second]).startswith(f"goodput {total['goodput']:.0%}: training ")


def test_a_rank_that_never_told_its_clock_leaves_the_time_to_launch_not_to_training():
    lost = AttemptTimes(0, 2, "failed", queued_at=0.0, submitted_at=0.0, ended_at=10.0, failed_at=8.0, clocks={})
    [row] = split(0.0, 10.0, [lost])
    assert row["launch"] == 8.0 and row["training"] == 0.0 and row["teardown"] == 2.0
    assert set(PARTS) <= set(row)


def test_rank_0s_clock_lost_with_its_python_worker_the_lowest_rank_left_stands_in():
    # kill_worker in the fault campaign: rank 0's supervisor died with the Python worker, rank 1's told.
    failed = AttemptTimes(0, 2, "failed", queued_at=0.0, submitted_at=0.0, ended_at=10.0, failed_at=9.0,
                          clocks={1: clock(2.0, 0.5, 3.0, data=0.5, stall=0.1, last_checkpoint=7.0,
                                           data_then=0.4, stall_then=0.1)})
    [row] = split(0.0, 10.0, [failed])
    assert row["launch"] == 2.0 and row["process_group"] == 0.5  # not 9 s of launch: rank 1 was training
    assert row["lost_work"] == 1.9 and row["training"] == 9.0 - 2.0 - 0.5 - 0.5 - 0.1 - 1.9
    assert row["wall"] == 10.0


def test_the_parts_add_up_to_the_wall_time_when_a_rank_went_on_past_the_abort():
    # Rank 0 blocked in a checkpoint save (a collective with the lost rank) from 2 s until the save gave up at 12 s:
    # its clock counts 10 s of stall, 3 of them after the driver saw the failure at 9 s.
    failed = AttemptTimes(0, 2, "failed", queued_at=0.0, submitted_at=0.0, ended_at=12.5, failed_at=9.0,
                          clocks={0: clock(1.0, 0.0, 2.0, data=0.0, stall=10.0, last_checkpoint=12.0,
                                           data_then=0.0, stall_then=10.0),
                                  1: clock(1.0, 0.0, 2.0, data=0.0, stall=0.0)})
    retried = AttemptTimes(1, 2, "succeeded", queued_at=12.5, submitted_at=12.5, ended_at=20.0,
                           clocks={r: clock(13.0, 0.0, 14.0, data=0.0, stall=0.0, end=19.0) for r in (0, 1)})
    first, second = split(0.0, 20.0, [failed, retried])
    assert first["checkpoint_stall"] == 8.0 and first["training"] == 0.0 and first["lost_work"] == 0.0
    assert first["wall"] == 9.0 and second["recovery"] == 3.5  # the abort at 9 s -> the retry queued at 12.5 s
    assert first["wall"] + second["wall"] == 20.0


def fails_once_after_a_checkpoint(steps=20, crash_at=14):
    """A step of 50 ms; a checkpoint after step 10; rank 1 of the first attempt dies after step 14."""
    import os
    import time

    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    ctx = get_context()
    dist.init_process_group("gloo")
    state = ctx.load_checkpoint(default={"step": 0})
    for step in range(state["step"], steps):
        time.sleep(0.05)
        dist.all_reduce(torch.ones(1))
        ctx.step()
        if step == 9:
            ctx.save_checkpoint({"step": 10})
        if step == crash_at and ctx.attempt == 0 and ctx.rank == 1:
            os._exit(3)
    return ctx.attempt


@ONE_LINE
def test_a_real_runs_parts_add_up_to_its_wall_time_and_name_the_work_lost_to_its_failure(tmp_path):
    import time

    pytest.importorskip("torch")
    from spark_dist import Distributor

    d = Distributor(num_processes=2, local_mode=True, max_retries=1, verbose=False, checkpoint_dir=str(tmp_path))
    started = time.time()
    assert d.run(fails_once_after_a_checkpoint) == 1
    wall = time.time() - started
    split = d.goodput()
    shown = split.to_string()
    assert split["ending"].tolist() == ["failed", "succeeded"], shown
    assert abs(split["wall"].sum() - wall) <= 0.02 * wall, (wall, shown)
    failed, retried = split.iloc[0], split.iloc[1]
    assert failed["lost_work"] >= 0.2, shown  # steps 10-14 (5 x 50 ms), then until the abort
    assert failed["training"] >= 0.4, shown  # the ten steps before its checkpoint are not lost
    assert retried["recovery"] > 0 and retried["lost_work"] == 0, shown
    assert failed["launch"] > 0 and failed["setup"] >= 0, shown  # a local run without datasets: setup ~1 ms
    assert retried["training"] >= 0.45, shown  # its ten steps of 50 ms
