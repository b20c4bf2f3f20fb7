"""An attempt's outcome and the retry rules: pure functions of what the attempt saw, as tables of cases."""
import dataclasses

import pytest

from spark_dist.errors import RankFailure, root_cause
from spark_dist.driver.outcome import AttemptEvidence, JobError, outcome_of, worth_retrying
from spark_dist.wire.protocol import NO_STACK, STOPPED, ResultChunk, TaskOutcome, TaskStatus
from spark_dist.wire.ranks import TaskInfo, assign_ranks

# Four tasks on two executors of one host (a local-cluster with 2-core executors), two on each; task 1 and
# task 2 share executor A.
TASKS = (TaskInfo(0, "h1", (), "h1:4001"), TaskInfo(1, "h1", (), "h1:4000"), TaskInfo(2, "h1", (), "h1:4000"),
         TaskInfo(3, "h1", (), "h1:4001"))
RANKS = tuple(assign_ranks(TASKS))
TWO_HOSTS = (TaskInfo(0, "h1"), TaskInfo(1, "h2"), TaskInfo(2, "h1"), TaskInfo(3, "h2"))  # h2 runs ranks 2, 3


def seen(**what):
    base = dict(driver_host="d", rendezvous_timeout=300.0, host_lost_timeout=10.0, timeout=60.0, now=1.0,
                tasks=TASKS, ranks=RANKS)
    return AttemptEvidence(**{**base, **what})


def raised(rank, message="boom", exc_type="ValueError", seq=None):
    return RankFailure(rank, "h1", "exception", message, exc_type=exc_type, seq=rank + 1 if seq is None else seq)


def echo(rank, seq):  # what a peer raises when the rank it talks to went away
    return RankFailure(rank, "h1", "exception", "Connection closed by peer [127.0.0.1]:1234",
                       exc_type="RuntimeError", seq=seq)


def gloo_read_error(rank, seq):  # gloo's wording for any errno on a pair: the peer died
    return RankFailure(rank, "h1", "exception", "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:26258: "
                       "Operation timed out. This is typically caused by a remote worker hanging or bugs in the "
                       "application. Check the logs of the remote worker before reporting an error. GLHF!",
                       exc_type="RuntimeError", seq=seq)


def killed(rank, seq):
    return RankFailure(rank, "h1", "signal", "killed by signal 9", signal=9, seq=seq)


MULTI_GPU_TASKS = tuple(TaskInfo(i, "h1", (str(i),), f"h1:400{i // 2}", i // 2) for i in range(4))
LOST_EXECUTOR = JobError("Py4JJavaError", (
    "An error occurred while calling o123.collect.\n: org.apache.spark.SparkException: Job aborted due to stage "
    "failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: Stage failed "
    "because barrier task ResultTask(3, 2) finished unsuccessfully.\nExecutorLostFailure (executor 0 exited "
    "caused by one of the running tasks) Reason: Command exited with code 137\n\tat org.apache.spark..."))
WORKER_DIED = JobError("Py4JJavaError", (
    "Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure "
    "reason: Stage failed because barrier task ResultTask(3, 3) finished unsuccessfully.\n"
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"))
NO_MODULE = JobError("Py4JJavaError", (
    "Stage failed because barrier task ResultTask(3, 0) finished unsuccessfully.\n"
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    "ModuleNotFoundError: No module named 'spark_dist'"))
NO_TASK = JobError("Py4JJavaError", "org.apache.spark.SparkException: Job aborted due to stage failure: Task "
                                    "serialization failed: java.io.NotSerializableException")


def named(outcome):
    """(rank, kind) of each failure, root cause first."""
    lead = root_cause(outcome.failures)
    return [(f.rank, f.kind) for f in [lead] + [f for f in outcome.failures if f is not lead]]


@pytest.mark.parametrize("case, what, expected", [
    ("rank 0's result, in chunks",
     dict(records=(ResultChunk(0, 1, b"lo"), ResultChunk(0, 0, b"hel"), TaskStatus(0, TaskOutcome.OK))),
     b"hello"),
])
def test_a_run_that_finished_returns_rank_0s_result(case, what, expected):
    outcome = outcome_of(seen(**what))
    assert outcome.failures is None and outcome.result_bytes == expected


@pytest.mark.parametrize("case, what, expected, timed_out", [
    ("one rank raised; its peers' echoes follow",
     dict(failures=(echo(0, 1), raised(2, seq=2), echo(1, 3))), [(2, "exception"), (0, "exception"), (1, "exception")],
     False),
    ("a rank killed by a signal leads over a peer's gloo error that was numbered first",
     dict(failures=(gloo_read_error(0, 1), killed(1, 2))), [(1, "signal"), (0, "exception")], False),
    ("the timeout leads: ranks with a dumped stack, then a report only for a rank without one",
     dict(timed_out=True, stacks={0: "File x", 1: "File y"}, failures=(raised(1), echo(3, 2))),
     [(0, "timeout"), (1, "timeout"), (3, "exception")], True),
    ("a rank that could not give its stack (stopped, stuck outside Python) leads over a peer waiting for it",
     dict(timed_out=True, stacks={0: 'File "torch/autograd/graph.py", line 979 in _engine_run_backward',
                                  1: NO_STACK + "it did not answer)"}),
     [(1, "timeout"), (0, "timeout")], True),
    ("a stopped rank leads over one that did not answer in time (its peer, slow on a loaded host)",
     dict(timed_out=True, stacks={0: NO_STACK + "it did not answer)", 1: NO_STACK + STOPPED + ")"}),
     [(1, "timeout"), (0, "timeout")], True),
    ("a timeout before every rank started names no rank", dict(timed_out=True, ranks=(), tasks=()),
     [(None, "timeout")], True),
    # The tasks' own backstop and the cancelled job follow the driver's rendezvous abort: not a "lost" task.
    ("rendezvous timeout with the job cancelled afterwards",
     dict(ranks=(), tasks=(), rendezvous_missing=(1,), job_error=NO_TASK), [(None, "timeout")], False),
    ("a silent host names every rank on it; its peers' reports follow",
     dict(tasks=TWO_HOSTS, ranks=tuple(assign_ranks(TWO_HOSTS)), lost_ranks=(2, 3), failures=(raised(0),)),
     [(2, "lost"), (3, "lost"), (0, "exception")], False),
    ("a lost executor names every rank it ran, not only the task Spark names",
     dict(job_error=LOST_EXECUTOR, failures=(echo(0, 1),)), [(1, "lost"), (2, "lost"), (0, "exception")], False),
    ("a dead Python worker is its task's rank alone",
     dict(job_error=WORKER_DIED, failures=(echo(0, 1),)), [(3, "lost"), (0, "exception")], False),
    ("a rank's own exception leads over the job failure it caused",
     dict(job_error=LOST_EXECUTOR, failures=(raised(3),)), [(3, "exception")], False),
    ("a job failure naming no task", dict(job_error=NO_TASK), [(None, "lost")], False),
    # Spark task 1 of a run of two-GPU tasks ran slots 2 and 3: its dead worker took both ranks.
    ("a dead Python worker of a two-GPU task is both its ranks",
     dict(job_error=JobError(WORKER_DIED.type_name, WORKER_DIED.text.replace("(3, 3)", "(3, 1)")),
          tasks=MULTI_GPU_TASKS, ranks=tuple(assign_ranks(MULTI_GPU_TASKS, "task"))),
     [(2, "lost"), (3, "lost")], False),
    # Under Spark Connect a failed stage takes the task-to-rank map (the first task's) with it.
    ("a lost executor with no rank map names the barrier task", dict(job_error=LOST_EXECUTOR, tasks=(), ranks=()),
     [(None, "lost")], False),
    ("no result, no report, no job error", dict(records=(TaskStatus(0, TaskOutcome.ABORTED),)), [(None, "lost")],
     False),
])
def test_failures_are_named_root_cause_first(case, what, expected, timed_out):
    outcome = outcome_of(seen(**what))
    assert outcome.result_bytes is None and outcome.timed_out is timed_out
    assert named(outcome) == expected


def test_the_messages_say_what_happened():
    by_rank = {f.rank: f for f in outcome_of(seen(job_error=LOST_EXECUTOR)).failures}
    assert by_rank[1].message.startswith("its executor h1:4000 was lost: ExecutorLostFailure (executor 0 exited")
    assert by_rank[1].host == "h1" and by_rank[1].exc_type == "Py4JJavaError"
    [missing] = outcome_of(seen(job_error=NO_MODULE)).failures
    assert missing.rank == 0 and "ModuleNotFoundError: No module named 'spark_dist'" in missing.message
    assert "set PYSPARK_PYTHON" in missing.message
    [unmapped] = outcome_of(seen(job_error=LOST_EXECUTOR, tasks=(), ranks=())).failures
    assert unmapped.host == "executor 0" and unmapped.message.startswith("its Spark task (barrier task 2) failed")
    [rendezvous] = outcome_of(seen(rendezvous_missing=(1, 3), ranks=(), tasks=())).failures
    assert rendezvous.message.startswith("the ranks did not all start within spark.dist.rendezvousTimeout=300s "
                                         "(tasks that never reached the run's store at d: 1, 3). ")
    # With the store's port known: host:port, what to check, and the keys that change it.
    [rendezvous] = outcome_of(seen(rendezvous_missing=(1,), ranks=(), tasks=(), store_port=29500)).failures
    assert "(tasks that never reached the run's store at d:29500: 1). If they ran, check that every executor " \
           "can reach d:29500: a firewall" in rendezvous.message
    assert "spark.dist.storePort" in rendezvous.message and "spark.driver.host" in rendezvous.message
    [connect] = outcome_of(seen(rendezvous_missing=(1,), ranks=(), tasks=(), store_port=29500,
                                store_in_task=True)).failures
    assert "first task's executor host" in connect.message and "spark.driver.host" not in connect.message
    silent = outcome_of(seen(tasks=TWO_HOSTS, ranks=tuple(assign_ranks(TWO_HOSTS)), lost_ranks=(2,))).failures[0]
    assert silent.host == "h2" and "no heartbeat from its ranks for 10s (spark.dist.hostLostTimeout)" in silent.message


@pytest.mark.parametrize("failures, previous, retry", [
    # An exception on one rank (a flaky read): worth another attempt.
    ([raised(1, "connection to the object store reset", "OSError")], [], True),
    # A rank out of memory, host or CUDA: it would ask for as much again.
    ([raised(1, "CUDA out of memory. Tried to allocate 2.00 GiB", "torch.OutOfMemoryError")], [], False),
    ([raised(0, "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                "to allocate 8000000000000 bytes. Error code 12 (Cannot allocate memory)", "RuntimeError")], [], False),
    # A ConfigError raised in a rank (a checkpoint that does not fit the model) fails again.
    ([raised(0, "the checkpoint does not fit", "spark_dist.errors.ConfigError")], [], False),
    # The same exception on every rank: a bug, not retried; also when the message differs only by numbers.
    ([raised(0, "'x'", "KeyError"), raised(1, "'x'", "KeyError")], [], False),
    ([raised(0, "shape [3, 0] on rank 0"), raised(1, "shape [3, 1] on rank 1")], [], False),
    # Different exceptions on different ranks: worth another attempt.
    ([raised(0, "a"), raised(1, "b", "KeyError")], [], True),
    # Deterministic whatever the ranks: a module missing on the executors, a result over maxResultSize.
    ([raised(0, "No module named 'mylib'", "ModuleNotFoundError")], [], False),
    ([raised(0, "rank 0 returned 80 MiB", "spark_dist.task.result.ResultTooLargeError")], [], False),
    # The same root cause as the attempt before: fails again.
    ([raised(1, "disk full", "OSError")], [raised(1, "disk full", "OSError")], False),
    # A lost executor is worth another attempt (its replacement may be fine), also when the attempt before lost
    # one the same way: a lost executor is no bug in the code.
    (outcome_of(seen(job_error=LOST_EXECUTOR)).failures, [], True),
    (outcome_of(seen(job_error=LOST_EXECUTOR)).failures, outcome_of(seen(job_error=LOST_EXECUTOR)).failures, True),
])
def test_retry_rules(failures, previous, retry):
    assert worth_retrying(failures, 2, previous) is retry


@pytest.mark.parametrize("exc_type, message, headline", [
    ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "79.10 GiB of which 1.05 GiB is free.", "ran out of CUDA memory asking for 2.00 GiB (torch.OutOfMemoryError"),
    ("RuntimeError", "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
     "tried to allocate 8000000000000 bytes.", "ran out of host memory asking for 7.28 TiB (RuntimeError"),
    ("numpy._core._exceptions._ArrayMemoryError", "Unable to allocate 7.45 GiB for an array with shape (1000000000,) "
     "and data type float64", "ran out of host memory asking for 7.45 GiB"),
    ("MemoryError", "", "ran out of host memory asking for an unknown size (MemoryError: )"),
])
def test_a_rank_out_of_memory_is_named_with_what_it_asked_for(exc_type, message, headline):
    failure = raised(1, message, exc_type)
    assert headline in failure.headline() and "Not retried" in failure.headline()
    assert failure.headline().startswith("rank 1 on host ")
    assert raised(1, "out of coffee", "RuntimeError").out_of_memory is None


CANCELLED_GROUP = JobError("Py4JJavaError", "org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 12 "
                                            "cancelled part of cancelled job group spark_dist-r-0")
CANCELLED_TAG = JobError("UnknownException", "(org.apache.spark.SparkSQLException) [OPERATION_CANCELED] "
                                             "Operation has been canceled. SQLSTATE: HY008")


@pytest.mark.parametrize("job_error", [CANCELLED_GROUP, CANCELLED_TAG])
def test_a_job_someone_cancelled_ends_the_run_without_a_retry(job_error):
    outcome = outcome_of(seen(job_error=job_error, failures=(echo(0, 1),)))
    assert named(outcome) == [(None, "cancelled"), (0, "exception")]
    assert "cancelled (from the Spark UI, or by its job group or tag)" in outcome.failures[0].message
    assert not worth_retrying(outcome.failures, 2, [])


def test_a_job_spark_dist_cancelled_itself_is_not_the_users_cancel():
    # After the abort grace spark_dist cancels the job itself: the rank's own report leads.
    outcome = outcome_of(seen(job_error=CANCELLED_GROUP, failures=(raised(1),), cancelled_here=True))
    assert named(outcome) == [(1, "exception")]


# -- each failure in full: who, where, what, when, and the number that orders it ------------------------------
def renumbered(failure, seq):
    return dataclasses.replace(failure, seq=seq)


SILENT = ("went silent: no heartbeat from its ranks for 10s (spark.dist.hostLostTimeout); it may be off the network "
          "or its executor frozen")
CANCELLED = "the run's Spark job was cancelled (from the Spark UI, or by its job group or tag)"
EXCEEDED = "the run exceeded timeout=60s"


def spark_failure(rank, host, message, seq, job_error):
    """What the outcome says of a rank (or a task, rank None) that Spark reported failed."""
    return RankFailure(rank, host, "lost", message, exc_type=job_error.type_name, traceback=job_error.text, seq=seq,
                       time=1.0)


@pytest.mark.parametrize("case, what, expected", [
    ("a silent host's ranks lead, numbered first; what they reported themselves is dropped",
     dict(tasks=TWO_HOSTS, ranks=tuple(assign_ranks(TWO_HOSTS)), lost_ranks=(2, 3),
          failures=(echo(2, 1), raised(0, seq=2))),
     [RankFailure(2, "h2", "lost", f"host h2 {SILENT}", seq=1, time=1.0),
      RankFailure(3, "h2", "lost", f"host h2 {SILENT}", seq=2, time=1.0), renumbered(raised(0, seq=2), 4)]),
    ("a cancelled job leads; the ranks' reports follow in their order",
     dict(job_error=CANCELLED_GROUP, failures=(echo(0, 1), echo(1, 2))),
     [RankFailure(None, "d", "cancelled", CANCELLED, exc_type="Py4JJavaError", seq=1, time=1.0),
      renumbered(echo(0, 1), 2), renumbered(echo(1, 2), 3)]),
    ("each hung rank with its stack, numbered by rank; a later report only for a rank without one, after them all",
     dict(timed_out=True, stacks={0: "File x", 1: "File y"}, failures=(raised(1), echo(3, 2))),
     [RankFailure(0, "h1", "timeout", EXCEEDED, traceback="File x", seq=1),
      RankFailure(1, "h1", "timeout", EXCEEDED, traceback="File y", seq=2), renumbered(echo(3, 2), len(RANKS) + 3)]),
    ("a timeout before every rank started", dict(timed_out=True, ranks=(), tasks=()),
     [RankFailure(None, "d", "timeout", f"{EXCEEDED} before every rank started")]),
    ("a timeout once the ranks had their places, but no stack came", dict(timed_out=True),
     [RankFailure(None, "d", "timeout", f"{EXCEEDED} while the ranks were starting")]),
    ("a lost executor's ranks lead, in rank order; their own echoes are dropped, their peers' follow",
     dict(job_error=LOST_EXECUTOR, failures=(echo(0, 1), echo(1, 2))),
     [spark_failure(1, "h1", "its executor h1:4000 was lost: ExecutorLostFailure (executor 0 exited caused by one "
                    "of the running tasks) Reason: Command exited with code 137", 1, LOST_EXECUTOR),
      spark_failure(2, "h1", "its executor h1:4000 was lost: ExecutorLostFailure (executor 0 exited caused by one "
                    "of the running tasks) Reason: Command exited with code 137", 2, LOST_EXECUTOR),
      renumbered(echo(0, 1), 3)]),
    ("a dead Python worker", dict(job_error=WORKER_DIED),
     [spark_failure(3, "h1", "its Spark task failed: Python worker exited unexpectedly (crashed)", 1, WORKER_DIED)]),
    ("a job failure naming no task: on the driver's host",
     dict(job_error=NO_TASK),
     [spark_failure(None, "d", "its Spark task failed: org.apache.spark.SparkException: Job aborted due to stage "
                    "failure: Task serialization failed: java.io.NotSerializableException", 1, NO_TASK)]),
    ("a lost executor with no rank map: its barrier task, on the executor Spark names",
     dict(job_error=LOST_EXECUTOR, tasks=(), ranks=()),
     [spark_failure(None, "executor 0", "its Spark task (barrier task 2) failed: ExecutorLostFailure (executor 0 "
                    "exited caused by one of the running tasks) Reason: Command exited with code 137", 1,
                    LOST_EXECUTOR)]),
])
def test_each_failure_in_full(case, what, expected):
    assert outcome_of(seen(**what)).failures == expected


# Task 1 holds GPU 2 and task 2 GPU 1 on executor h1:4000: rank 1 is task 2's, rank 2 task 1's.
GPU_ORDER_TASKS = (TaskInfo(0, "h1", ("0",), "h1:4001"), TaskInfo(1, "h1", ("2",), "h1:4000"),
                   TaskInfo(2, "h1", ("1",), "h1:4000"), TaskInfo(3, "h1", ("3",), "h1:4001"))


def test_a_lost_executors_ranks_are_numbered_in_rank_order_not_task_order():
    ranks = tuple(assign_ranks(GPU_ORDER_TASKS))
    outcome = outcome_of(seen(job_error=LOST_EXECUTOR, tasks=GPU_ORDER_TASKS, ranks=ranks))
    assert [(f.rank, f.seq) for f in outcome.failures] == [(1, 1), (2, 2)]


def test_the_rendezvous_timeout_says_which_tasks_never_came_and_what_to_check():
    [failure] = outcome_of(seen(rendezvous_missing=(1, 3), ranks=(), tasks=(), store_port=29500)).failures
    assert failure == RankFailure(None, "d", "timeout", (
        "the ranks did not all start within spark.dist.rendezvousTimeout=300s (tasks that never reached the run's "
        "store at d:29500: 1, 3). If they ran, check that every executor can reach d:29500: a firewall between them "
        "blocks it unless the port is open (pin it with spark.dist.storePort, a port or a range, and open that); the "
        "address is spark.driver.host (the driver binds spark.driver.bindAddress where that is set): it must be one "
        "the executors can reach, not a loopback or NAT-internal address"), time=1.0)
    # Under Spark Connect the first task hosts the store.
    [connect] = outcome_of(seen(rendezvous_missing=(1,), ranks=(), tasks=(), store_in_task=True)).failures
    assert connect.message.endswith("and open that); the address is the first task's executor host, where the store "
                                    "lives under Spark Connect: executors must reach each other")


@pytest.mark.parametrize("records, how_they_ended", [
    ((TaskStatus(0, TaskOutcome.ABORTED), TaskStatus(1, TaskOutcome.OK)), "task 0 aborted, task 1 ok"),
    ((), "none"),
])
def test_a_job_that_ended_without_a_result_or_a_report_says_how_each_task_ended(records, how_they_ended):
    assert outcome_of(seen(records=records)).failures == [RankFailure(
        None, "d", "lost", "the Spark job ended without rank 0's result and no rank reported a failure (task "
        f"outcomes: {how_they_ended})", time=1.0)]


# Local mode: the ranks are processes of the driver, all Spark task 0 and on no executor.
LOCAL_TASKS = (TaskInfo(0, "h", (), "", 0), TaskInfo(1, "h", (), "", 0))
ONE_TWO_GPU_TASK = (TaskInfo(0, "h1", ("0",), "h1:4000", 0), TaskInfo(1, "h1", ("1",), "h1:4000", 0))


@pytest.mark.parametrize("tasks, on_driver", [(LOCAL_TASKS, True), (TASKS, False), (ONE_TWO_GPU_TASK, False)])
def test_a_rank_that_ran_on_the_driver_is_marked_so(tasks, on_driver):
    # A SIGKILL there points to the driver's memory settings, not an executor's.
    outcome = outcome_of(seen(tasks=tasks, ranks=tuple(assign_ranks(tasks)), failures=(killed(1, 1),)))
    assert outcome.failures == [dataclasses.replace(killed(1, 1), on_driver=on_driver)]


# -- what a failed Spark job's text says: the reason given -----------------------------------------------------
LONG_ERROR = "ValueError: " + "x" * 600


@pytest.mark.parametrize("text, reason", [
    # The Python error leads, not the JVM's and py4j's lines around it.
    ("py4j.protocol.Py4JJavaError: An error occurred while calling o42.collectToPython.\n"
     ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
     "java.lang.RuntimeException: the Python task failed\n"
     "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
     "  File \"train.py\", line 3, in train\nKeyError: 'features'", "KeyError: 'features'"),
    # Without one: the first line that names an exception or a loss, else the first line.
    ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage.\n"
     "Lost task 1.0 in stage 3.0 (TID 7) (10.0.0.5 executor 1): TaskKilled (killed by the driver)",
     "Lost task 1.0 in stage 3.0 (TID 7) (10.0.0.5 executor 1): TaskKilled (killed by the driver)"),
    ("Job aborted due to stage failure: Task serialization failed\n"
     "org.apache.spark.SparkException: java.io.NotSerializableException: MyModel",
     "org.apache.spark.SparkException: java.io.NotSerializableException: MyModel"),
    ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage.\n"
     "Command exited with code 1", "Job aborted due to stage failure: Could not recover from a failed barrier "
     "ResultStage."),
    ("", "Py4JJavaError"),  # no text at all: the error's type
    # A module missing on the executors: what to set.
    ("ModuleNotFoundError: No module named 'torch'", "ModuleNotFoundError: No module named 'torch' (the executors' "
     "Python lacks spark_dist's packages: set PYSPARK_PYTHON or spark.executorEnv.PYSPARK_PYTHON to a Python that "
     "has spark_dist installed)"),
    (LONG_ERROR, LONG_ERROR[:500]),  # at most 500 characters
])
def test_a_failed_spark_job_is_told_by_its_most_telling_line(text, reason):
    [failure] = outcome_of(seen(job_error=JobError("Py4JJavaError", text), tasks=(), ranks=())).failures
    assert failure.message == f"its Spark task failed: {reason}"


def test_a_failed_tasks_traceback_is_its_python_traceback_not_the_jvms_frames():
    python = ("Traceback (most recent call last):\n"
              "  File \"/spark/python/pyspark/worker.py\", line 4207, in invoke_udf\n    func = read_udfs(\n"
              "ModuleNotFoundError: No module named 'spark_dist'")
    jvm = "".join(f"\tat org.apache.spark.scheduler.Frame{i}.run(Frame.scala:{i})\n" for i in range(200))
    text = ("org.apache.spark.SparkException: Job aborted due to stage failure: Stage failed because barrier task "
            f"ResultTask(3, 1) finished unsuccessfully.\norg.apache.spark.api.python.PythonException: "
            f"[PYTHON_EXCEPTION] An exception was thrown from the Python worker: {python}\n SQLSTATE: 38000\n{jvm}"
            f"Driver stacktrace:\n{jvm}")
    [failure] = outcome_of(seen(job_error=JobError("Py4JJavaError", text))).failures
    assert failure.traceback == python


def test_a_failed_tasks_rank_gets_its_reason_cut_to_500_characters_too():
    error = JobError("Py4JJavaError", f"Stage failed because barrier task ResultTask(3, 1) finished "
                                      f"unsuccessfully.\n{LONG_ERROR}")
    [failure] = outcome_of(seen(job_error=error)).failures
    assert failure.rank == 1 and failure.message == f"its Spark task failed: {LONG_ERROR[:500]}"


def test_the_report_keeps_the_end_of_a_long_spark_error_where_its_cause_is():
    text = "org.apache.spark.SparkException: Job aborted\n" + "\tat org.apache.spark.scheduler.DAGScheduler." \
        "failJobAndIndependentStages(DAGScheduler.scala:2898)\n" * 60 + "Caused by: java.io.IOException: disk full"
    [failure] = outcome_of(seen(job_error=JobError("Py4JJavaError", text))).failures
    # No Python traceback in it: its last 4000 characters, from the first whole line in them
    assert failure.traceback.startswith("\tat org.apache.spark.scheduler.DAGScheduler.failJob")
    assert text.endswith(failure.traceback) and 4000 - 100 < len(failure.traceback) <= 4000
