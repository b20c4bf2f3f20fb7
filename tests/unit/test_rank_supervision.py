"""spark_dist.task.barrier_task's supervision of one rank process, with a real store and a real child process."""
import os
import signal
import subprocess
import sys

from spark_dist.task import barrier_task, child_process
from spark_dist.wire.protocol import ABORT, FAILURES, Abort, LaunchSpec, TaskOutcome
from spark_dist.wire.ranks import RankInfo
from spark_dist.wire.sealed_store import SealedStore, host_store
from spark_dist.wire.store_log import StoreLog


def child_running(code):
    """A rank process running the Python ``code``."""
    popen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    fds = os.dup(popen.stdout.fileno()), os.dup(popen.stderr.fileno())
    popen.stdout.close()
    popen.stderr.close()
    return child_process.ChildProcess(popen.pid, *fds, popen)


def child_killed_after(seconds):
    """A rank process that SIGKILLs itself after ``seconds``."""
    return child_running(f"import os, signal, time; time.sleep({seconds}); os.kill(os.getpid(), signal.SIGKILL)")


def test_a_rank_killed_while_a_peers_failure_aborts_the_run_is_reported_as_killed(tmp_path):
    # The race of a rank killed in a collective: its peer fails at once ("connection closed by peer") and
    # aborts the run before this rank's supervisor has seen its child die. The kill is the root cause, so it
    # must be reported, not taken for a rank the abort stopped.
    server, port = host_store("127.0.0.1", 30)
    spec = LaunchSpec(run_id="r", attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=b"s" * 32, relay_output="none")
    store = SealedStore(server, spec.secret, spec.prefix)
    store.put(ABORT, Abort.RANK_FAILED)
    rank = RankInfo(1, 1, 2, 2, 0, 1, "127.0.0.1")
    outcome = barrier_task._supervise(child_killed_after(0.2), store, spec, rank, str(tmp_path), in_executor=False)
    assert outcome is TaskOutcome.FAILED
    [failure] = StoreLog(store, FAILURES).take()
    assert (failure.rank, failure.kind, failure.signal) == (1, "signal", signal.SIGKILL)


def test_a_supervisor_looks_for_a_stalls_request_for_stacks_every_other_beat(tmp_path):
    # Each look is a request to the driver's store a rank a second: every other beat halves it, and a stall (called
    # after minutes) still gets its stacks within the driver's wait for them.
    from spark_dist.wire.protocol import STACKS_WANTED

    class Counting(SealedStore):
        looks, beats = 0, 0

        def lookup(self, name, default=None):
            Counting.looks += name == STACKS_WANTED
            return super().lookup(name, default)

        def put(self, name, value):
            Counting.beats += name.startswith("beat/")
            super().put(name, value)

    server, port = host_store("127.0.0.1", 30)
    spec = LaunchSpec(run_id="r", attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=b"s" * 32, relay_output="none")
    store = Counting(server, spec.secret, spec.prefix)
    barrier_task._supervise(child_running("import time; time.sleep(3.5)"), store, spec,
                            RankInfo(0, 0, 1, 1, 0, 1, "127.0.0.1"), str(tmp_path), in_executor=False)
    assert Counting.beats >= 3
    assert Counting.looks == (Counting.beats + 1) // barrier_task.STACKS_LOOK_EVERY
