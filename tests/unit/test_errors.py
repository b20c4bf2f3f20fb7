"""Failures pickle cleanly and lead with the root cause, not the peers' echoes."""
import pickle
import signal

from spark_dist import TrainingFailedError
from spark_dist.errors import RankFailure, root_cause


def _failure(rank, seq, message, exc_type="RuntimeError", kind="exception", **kw):
    return RankFailure(rank, f"host{rank}", kind, message, exc_type=exc_type, seq=seq, **kw)


def test_root_cause_skips_a_peer_that_only_lost_its_partner():
    echo = _failure(0, 1, "[/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234")
    real = _failure(1, 2, "CUDA out of memory", exc_type="torch.OutOfMemoryError")
    assert echo.secondary and not real.secondary
    assert root_cause([echo, real]) is real


def test_signal_death_is_named():
    dead = RankFailure(1, "h", "signal", "killed", signal=signal.SIGKILL, seq=1)
    error = TrainingFailedError([dead])
    assert error.rank == 1 and error.signal == signal.SIGKILL
    assert "rank 1 on host h was killed by signal SIGKILL (9)" in str(error)


def test_a_sigkill_points_to_the_memory_settings_of_where_the_rank_ran():
    # Nothing catches SIGKILL: its usual sender is an OOM killer or a container's memory limit.
    in_task = str(TrainingFailedError([RankFailure(1, "h", "signal", "killed", signal=signal.SIGKILL)]))
    assert "was killed by signal SIGKILL (9): this is usually memory" in in_task
    for key in ("spark.executor.memoryOverhead", "spark.executor.pyspark.memory", "spark.executor.memory"):
        assert key in in_task
    on_driver = RankFailure(1, "h", "signal", "killed", signal=signal.SIGKILL, on_driver=True)
    local = str(pickle.loads(pickle.dumps(TrainingFailedError([on_driver]))))  # the mark survives the trip
    assert "the machine running out of memory" in local and "local_mode=True" in local
    assert "spark.driver.memory" in local and "spark.executor" not in local
    # Where the rank's memory cgroup counted the OOM killer's kills, no guess: it was the OOM killer, or it was not.
    by_oom = str(TrainingFailedError([RankFailure(1, "h", "signal", "killed", signal=signal.SIGKILL,
                                                  oom_killed=True)]))
    assert "SIGKILL (9) by the kernel's OOM killer" in by_oom and "the rank's memory ran out" in by_oom
    assert "usually" not in by_oom and "spark.executor.memoryOverhead" in by_oom
    not_oom = RankFailure(1, "h", "signal", "killed", signal=signal.SIGKILL, oom_killed=False).headline()
    assert not_oom == ("rank 1 on host h was killed by signal SIGKILL (9), not by the kernel's OOM killer (its "
                       "memory cgroup counted no OOM kill while it ran): another process or a person on that host "
                       "sent it, or a user-space OOM daemon (earlyoom and the like count nothing there)")
    # Another signal was sent on purpose by someone: no guess.
    other = RankFailure(1, "h", "signal", "killed", signal=signal.SIGTERM).headline()
    assert other == "rank 1 on host h was killed by signal SIGTERM (15)"


def test_training_failed_error_round_trips_through_pickle_with_its_cause():
    import cloudpickle

    original = _failure(1, 1, "bad lr", exc_type="ValueError", traceback="Traceback ...\nValueError: bad lr",
                        exception_bytes=cloudpickle.dumps(ValueError("bad lr")))
    error = pickle.loads(pickle.dumps(TrainingFailedError([original], attempts=2, run_id="r1")))
    assert (error.rank, error.host, error.exc_type, error.attempts) == (1, "host1", "ValueError", 2)
    assert isinstance(error.cause, ValueError) and "after 2 attempts" in str(error)
    assert "ValueError: bad lr" in error.remote_traceback
