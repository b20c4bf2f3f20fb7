"""A rank's steps (spark_dist.task.steps): counted where the loader hands a batch over (or ``ctx.step()`` marks
one), the count seen by the supervisor through the shared file, each step split into its wait for data, its
compute and the time it was blocked; no JVM."""
import time
from types import SimpleNamespace

from spark_dist.data.read.loader_state import counted
from spark_dist.task import steps


def a_loader(clock):
    return SimpleNamespace(batches=0, rows=0, _at=None, on_progress=None, step_clock=clock)


def slow_batches(n, wait):
    for i in range(n):
        time.sleep(wait)
        yield {"x": [i]}


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_each_batch_is_a_step_the_supervisor_sees_counted_with_the_rest_of_the_clock(tmp_path):
    path = steps.make_clock_file(str(tmp_path))
    reader = steps.ClockReader(path)
    clock = steps.StepClock(path)
    clock.function_started()
    loader = a_loader(clock)
    seen = []
    for _ in counted(loader, 0, slow_batches(3, 0.01), 0, 3):
        seen.append(reader.count())
    assert seen == [1, 2, 3] and clock.count == 3
    clock.mark()  # a step without a loader
    clock.saved(0.25)
    clock.function_ended()
    assert reader.count() == 4
    left = reader.read()  # what the supervisor sends once the rank ended
    assert left["steps"] == 4 and left["data_wait"] >= 0.03 and left["checkpoint_stall"] == 0.25
    assert left["function_start"] <= left["first_step"] <= left["last_checkpoint"] <= left["function_end"]
    assert left["data_wait_at_checkpoint"] == left["data_wait"]
    reader.close()
    clock.close()


def test_the_process_group_set_up_is_timed(tmp_path):
    dist = __import__("pytest").importorskip("torch.distributed")
    path = steps.make_clock_file(str(tmp_path))
    steps.StepClock(path).time_group_setup()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        left = steps.ClockReader(path).read()
        assert 0 < left["group_start"] <= left["group_end"]
    finally:
        dist.destroy_process_group()


def test_a_step_splits_into_the_wait_for_its_batch_its_compute_and_the_time_blocked():
    clock = steps.StepClock()
    for _ in counted(a_loader(clock), 0, slow_batches(6, 0.03), 0, 6):
        busy(0.02)  # compute
        time.sleep(0.04)  # blocked: as in a collective waiting for a peer
    timed = clock.summary()
    assert timed["steps"] == 6 and timed["timed_steps"] == 6
    assert 0.025 <= timed["wait_p50"] < 0.1
    assert 0.015 <= timed["compute_p50"] < 0.06  # runnable time: on a CPU, or queued for one
    assert 0.03 <= timed["blocked_p50"] < 0.1
    assert abs(timed["own_p50"] - timed["wait_p50"] - timed["compute_p50"]) < 0.01
    assert timed["step_p50"] >= 0.085


def test_the_time_between_epochs_and_a_loop_that_left_early_are_not_steps():
    clock = steps.StepClock()
    for _ in counted(a_loader(clock), 0, slow_batches(2, 0.0), 0, 2):
        pass
    time.sleep(0.2)  # an evaluation between epochs
    for _ in counted(a_loader(clock), 1, slow_batches(2, 0.0), 0, 2):
        break  # left after its first batch: that step's end is unknown
    timed = clock.summary()
    assert timed["steps"] == 3 and timed["timed_steps"] == 2
    assert timed["step_p90"] < 0.1
