"""Telling a stall and diagnosing it (spark_dist.driver.stall), from step counts and faulthandler dumps as the
supervisors send them; no JVM. Real runs that stall: tests/spark/test_stall_runs.py."""
from spark_dist.driver.stall import RankStack, StallWatch, diagnose

IN_ALL_REDUCE = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Current thread 0x00007f00 (most recent call first):
  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/home/me/train.py", line 30 in train
  File "/venv/lib/python3.12/site-packages/spark_dist/task/rank_process.py", line 97 in child_main
"""
IN_OWN_CODE = """Current thread 0x00007f00 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/home/me/train.py", line 27 in train
  File "/venv/lib/python3.12/site-packages/spark_dist/task/rank_process.py", line 97 in child_main
"""


def stacks(*frames_by_rank, steps=None):
    return [RankStack(rank, f"host{rank % 2}", (steps or {}).get(rank, 3), stack)
            for rank, stack in enumerate(frames_by_rank)]


def test_a_rank_apart_from_its_peers_waiting_in_a_collective_is_behind_and_named_with_its_own_line():
    diagnosis = diagnose(12.0, stacks(IN_ALL_REDUCE, IN_ALL_REDUCE, IN_OWN_CODE, IN_ALL_REDUCE))
    assert diagnosis.behind == [2]
    assert diagnosis.lines() == [
        "no rank has finished a step for 12s while all are alive (spark.dist.stallTimeout): rank 2 is behind",
        "  rank 2 (on host0) after step 3, waiting in threading.py:359 (wait), from train.py:27 (train)",
        "  ranks 0, 1, 3 (on host0, host1) after step 3, waiting in distributed_c10d.py:2501 (all_reduce), from "
        "train.py:30 (train)",
    ]
    text = diagnosis.text()
    assert "--- rank 2 on host0, 3 steps ---" in text and 'train.py", line 27' in text


def test_the_ranks_with_fewest_steps_are_behind_and_none_when_all_wait_alike():
    assert diagnose(5, stacks(IN_ALL_REDUCE, IN_ALL_REDUCE, IN_ALL_REDUCE, steps={1: 2})).behind == [1]
    alike = diagnose(5, stacks(IN_ALL_REDUCE, IN_ALL_REDUCE))
    assert alike.behind == [] and "every rank waits in the same place" in alike.headline()
    assert diagnose(5, stacks(IN_ALL_REDUCE, IN_OWN_CODE)).behind == [1]  # not waiting for its peer: behind
    two_places = diagnose(5, stacks(IN_OWN_CODE, IN_OWN_CODE.replace("line 359", "line 360")))
    assert two_places.behind == [] and "the ranks wait in 2 places" in two_places.headline()


def test_a_stall_begins_once_no_count_moved_for_the_timeout_and_again_only_after_a_move():
    watch = StallWatch(timeout=10)
    assert not watch.observe(0, {0: 0, 1: 0})  # nothing counted yet: a run without steps is not watched
    assert not watch.observe(100, {0: 0, 1: 0})
    assert not watch.observe(101, {0: 1, 1: 0})  # the first step
    assert not watch.observe(110, {0: 1, 1: 0})
    assert watch.observe(111.5, {0: 1, 1: 0}) and watch.stalls == 1
    assert not watch.observe(130, {0: 1, 1: 0})  # the same stall
    assert not watch.observe(131, {0: 1, 1: 1})  # moved: the stall is over
    assert not watch.observe(140, {0: 1, 1: 1})
    assert watch.observe(141, {0: 1, 1: 1}) and watch.stalls == 2
    off = StallWatch(timeout=10, action="off")
    assert not off.observe(0, {0: 1}) and not off.observe(1000, {0: 1})
