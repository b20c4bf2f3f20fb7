"""A study's lanes (spark_dist.driver.lanes) on real Spark, driven as a trial's attempts drive them: a lane that
did not serve a run whole, or was cancelled, serves no other; a retry gets a new lane; a closed pool starts none.
(Trials on lanes under optimize: tests/spark/test_lanes_runs.py and tests/spark/test_tune_runs.py.)"""
import dataclasses
import socket
import time

import pytest

from spark_dist.config import RunConfig
from spark_dist.driver import slots
from spark_dist.driver.attempt import launch_spec
from spark_dist.driver.lanes import LaneLost, LanePool


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_job(spark, lane):
    """Until the lane's job has started (a lane cancelled before that never submits one)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while not tracker.getJobIdsForGroup(lane.tag):
        assert time.monotonic() < deadline, f"{lane.tag} submitted no job"
        time.sleep(0.05)


def statuses(spark, pool, numbers):
    tracker = spark.sparkContext.statusTracker()
    return [tracker.getJobInfo(job).status for n in numbers
            for job in tracker.getJobIdsForGroup(f"spark_dist-lane-{pool.pool_id}-{n}")]


def test_a_lane_serves_no_run_after_one_it_did_not_serve_whole(spark_local):
    spark = spark_local
    config = RunConfig.build(num_processes=2, spark_conf={"spark.driver.host": "127.0.0.1"})
    # A run whose store no task can reach: each task posts a LaneFailure instead of the run's records.
    unreachable = dataclasses.replace(
        launch_spec(config, 0, b"", {}, "", "", "127.0.0.1", closed_port()), rendezvous_timeout=1.0)
    pool = LanePool(spark, config)
    try:
        with pool.lane() as handle:
            with handle.ready(fresh=False):
                first = handle.current
            with pytest.raises(LaneLost, match=r"lane .*-1: task \d could not serve run"):
                handle.collect(unreachable)
            assert not first.alive  # its other task may still be in that run: the lane is cancelled

            with handle.ready(fresh=False):  # the next attempt readies a new lane ...
                second = handle.current
            assert second is not first and second.alive
            with handle.ready(fresh=True):  # ... and a retry one of its own, though the lane lives
                third = handle.current
            assert third is not second and not second.alive

            wait_for_job(spark, third)
            third.cancel()  # a pruned trial whose tasks were slow to return: cancelled, asynchronously
            assert not third.alive  # at once: the pool cannot hand it to the next trial
        with pool.lane() as handle:
            with handle.ready(fresh=False):
                assert handle.current not in (first, second, third)
                fourth = handle.current

        wait_for_job(spark, fourth)
        pool.cancel_all()  # Ctrl-C: the lanes' jobs go, and no lane starts any more
        assert not fourth.alive
        with pool.lane() as handle:
            with pytest.raises(LaneLost, match="closed"):
                with handle.ready(fresh=False):
                    pass
    finally:
        pool.close()
    # The cancelled lanes' jobs failed; the one retired for a retry returned by itself; the broken one ended
    # (its tasks may have returned after their failures before the cancel came).
    assert statuses(spark, pool, [2, 3, 4]) == ["SUCCEEDED", "FAILED", "FAILED"]
    assert statuses(spark, pool, [1]) in (["FAILED"], ["SUCCEEDED"])
    assert slots.ledger_for(spark).held == 0
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_a_retry_gets_a_lane_of_its_own_not_another_trials_idle_one(spark_local):
    spark = spark_local
    config = RunConfig.build(num_processes=1, spark_conf={"spark.driver.host": "127.0.0.1"})
    pool = LanePool(spark, config)
    try:
        with pool.lane() as retried:
            with retried.ready(fresh=False):
                first = retried.current
            with pool.lane() as other:  # another trial, whose lane is then free for the next trial
                with other.ready(fresh=False):
                    idle = other.current
            assert idle.alive
            # The retry after a failure (or a preemption) may not land where the idle lane's tasks are.
            with retried.ready(fresh=True):
                assert retried.current not in (first, idle)
            # The idle lane was retired as the new one started: its slot may be the one the new lane waits for.
            assert not idle.alive and slots.ledger_for(spark).held == 1
    finally:
        pool.close()
    assert slots.ledger_for(spark).held == 0
