"""Shared Spark set-ups for the tests (see tests/clusters.py).

Fixtures (use at most one spark_* fixture per test: only one SparkContext can live in a process):
  spark_local          SparkSession on local[2]
  spark_local_cluster  SparkSession on local-cluster[2,1,1024]: 2 executor JVMs, 1 core and
                       1 fake GPU each (addresses "0" and "1"), 1 GPU per task; the driver
                       has 2 fake GPUs of its own ("0", "1": spark.driver.resource.gpu.*)
  spark_multi_gpu_tasks  SparkSession on local-cluster[2,1,1024] with 2 fake GPUs per executor ("0","1"
                       and "2","3") and 2 GPUs per task
  spark_standalone     SparkSession on the standalone cluster below (2 executors, 1 core each)
  standalone_cluster   the StandaloneCluster: .master_url, .master_pid, .worker_pids,
                       .executor_pids(), .spark_submit, .spark_home. Used without
                       spark_standalone, it first stops the in-process session so that the
                       cluster's cores are free for an app the test submits itself.
  spark_two_hosts      SparkSession on a standalone cluster whose two workers run in network
                       namespaces at 10.213.0.2 and .3 (tests/two_hosts.py; root only, else skipped)
  spark_manager        the session-wide SparkManager behind all of these
"""
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid

# Before anything can start a JVM: loopback only, executors run this interpreter, and every
# process started from here carries a marker the leak check looks for.
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_DIST_TEST_SESSION"] = uuid.uuid4().hex  # fresh even in a nested pytest
# A suite started in the background by a shell (`make test &`, nohup) inherits SIGINT ignored, and so would every
# process it starts: the tests that press Ctrl-C on a command need it as a terminal leaves it. A handler here is
# reset to the default in each program the suite starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Every temp file of the run in a directory of its own, removed at the end: what JVMs killed on purpose leave
# (their native libraries, Spark's local directories) and what torchrun leaves (a log directory per agent, one
# per task of PySpark's TorchDistributor) would otherwise stay in the machine's temp dir after each run. Python
# (TMPDIR) and every JVM (java.io.tmpdir) the suite starts use it. What must be shared with the other Spark
# line's run, which runs at the same time (the two-host lock), and pytest's own tmp_path directories (kept for
# a look after a failure, as pytest keeps them) stay in the machine's temp dir (SPARK_DIST_TEST_MACHINE_TMP).
os.environ.setdefault("SPARK_DIST_TEST_MACHINE_TMP", tempfile.gettempdir())
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", os.environ["SPARK_DIST_TEST_MACHINE_TMP"])
RUN_TEMP_DIR = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="spark_dist-test-tmp-")
tempfile.tempdir = None  # read TMPDIR again
# Every JVM the suite starts (drivers, spark-submit's launcher, masters, workers, executors, the Connect
# server) lives for seconds to minutes and runs little hot code: the C2 compiler and the parallel GC's threads
# cost more CPU than they save, and CPU one JVM spends is taken from the rest of the suite. So they run with
# C1 only and the serial GC; nothing the tests check depends on the JIT or the collector. Nor on HotSpot
# verifying the bytecode of Spark's and its libraries' jars as it loads them (it still verifies the JDK's own),
# which costs every JVM CPU at its start. (What a short session's driver JVM costs in CPU with these options:
# BENCHMARKS.md, Spark ML.)
os.environ["JAVA_TOOL_OPTIONS"] = " ".join(
    p for p in [os.environ.get("JAVA_TOOL_OPTIONS", ""), "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote",
                f"-Djava.io.tmpdir={RUN_TEMP_DIR}"] if p)
# cloudpickle pickles functions of test modules by reference ("test_x.f"): Python workers of every
# set-up (they inherit the JVM's environment) must be able to import tests/*.py, tests/<kind>/*.py and the
# example scripts' functions (tests/scripts/*.py) too.
_tests_dir = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [_tests_dir, *(os.path.join(_tests_dir, kind) for kind in ("unit", "spark", "e2e", "scripts")),
                os.environ.get("PYTHONPATH", "")] if p)

import pyspark  # noqa: E402
import pytest  # noqa: E402
import pytest_timeout  # noqa: E402
from pyspark import SparkContext  # noqa: E402

from clusters import (  # noqa: E402
    CONNECT_LOCAL, CONNECT_STANDALONE, LOCAL, LOCAL_CLUSTER, MULTI_GPU_TASKS, SESSION_MARKER, SHARED_EXECUTORS,
    STANDALONE,
    TWO_HOSTS, SparkManager, connect_available, describe,
    stop_gateway, wait_for_no_leaks,
)

MARKER = os.environ[SESSION_MARKER]
# tests/unit: no JVM; tests/spark: shared sessions; tests/chaos: the fault campaign, on them; tests/e2e: subprocesses
KINDS = ("unit", "spark", "chaos", "e2e")
_LINE = ".".join(pyspark.__version__.split(".")[:2])  # the Spark line of this run: "3.5" or "4.x"
_manager = None


def _group(item):
    """Sort key: one switch per kind. Standalone tests using the session run before those that
    only use the cluster (and stop the session), so the session starts once."""
    names = item.fixturenames
    if "spark_two_hosts" in names:
        # The two hosts' namespaces have fixed names, one Spark line's run at a time (tests/two_hosts.py's lock):
        # `make test` runs both lines at once, and they take the namespaces at opposite ends of their runs, the
        # 3.5 line first, instead of one waiting for the other.
        return -1 if _LINE == "3.5" else 8
    if "spark_connect_standalone" in names:
        return 7
    if "spark_connect" in names:
        return 6
    if "spark_standalone" in names:
        return 4
    if "standalone_cluster" in names:
        return 5
    if "spark_shared_executors" in names:
        return 3
    if "spark_multi_gpu_tasks" in names:
        return 2.5
    if "spark_local_cluster" in names:
        return 2
    if "spark_local" in names:
        return 1
    return 0


def pytest_collection_modifyitems(session, config, items):
    for item in items:  # its folder is its kind: `pytest -m unit` (or tests/unit) runs the tests with no JVM
        kind = os.path.basename(os.path.dirname(str(item.fspath)))
        if kind in KINDS:
            item.add_marker(kind)
    items.sort(key=_group)  # stable: file order within a group


@pytest.fixture(scope="session")
def spark_manager(tmp_path_factory):
    global _manager
    _manager = SparkManager(str(tmp_path_factory.mktemp("spark")))
    yield _manager
    _shutdown()


def _shutdown():
    global _manager
    manager, _manager = _manager, None
    try:
        if manager is not None:
            manager.shutdown()
    finally:
        stop_gateway()  # also covers a SparkContext a test made by itself


JOB_GRACE_S = 30  # a cancelled job (a lane closing, a run's cancel) ends a little after run() returned


def _session(manager, kind):
    """The shared session of ``kind``; after the test, no job of it may still run: one left running (a lane left
    open, a run's job not cancelled) would hold the slots the next test waits for. It is cancelled, and the
    test that left it fails in its teardown, naming the jobs' groups."""
    spark = manager.get(kind)
    yield spark
    if manager.spark is not spark or SparkContext._active_spark_context is not spark.sparkContext:
        return
    tracker, deadline = spark.sparkContext.statusTracker(), time.monotonic() + JOB_GRACE_S
    while (left := list(tracker.getActiveJobsIds())) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        store = spark.sparkContext._jsc.sc().statusStore()
        groups = sorted({str(g.get() if (g := store.job(j).jobGroup()).isDefined() else None) for j in left})
        spark.sparkContext.cancelAllJobs()
        pytest.fail(f"Spark jobs {left} (groups {groups}) still ran {JOB_GRACE_S} s after the test: cancelled "
                    "now", pytrace=False)


@pytest.fixture
def spark_local(spark_manager):
    yield from _session(spark_manager, LOCAL)


@pytest.fixture
def runtime_conf(spark_local):
    """spark.conf.set on the local session for the test, restored after it (``runtime_conf(key, value)``)."""
    before = {}

    def set_conf(key, value):
        before.setdefault(key, spark_local.conf.get(key, None))
        spark_local.conf.set(key, value)

    yield set_conf
    for key, value in before.items():
        if value is None:
            spark_local.conf.unset(key)
        else:
            spark_local.conf.set(key, value)


@pytest.fixture
def spark_local_cluster(spark_manager):
    yield from _session(spark_manager, LOCAL_CLUSTER)


@pytest.fixture
def spark_multi_gpu_tasks(spark_manager):
    """local-cluster[2,1,1024] whose two executors hold two fake GPUs each ("0","1" and "2","3"), and
    spark.task.resource.gpu.amount=2: every task holds two GPUs."""
    yield from _session(spark_manager, MULTI_GPU_TASKS)


@pytest.fixture
def spark_shared_executors(spark_manager):
    """Two executors of two cores each: two ranks share an executor."""
    yield from _session(spark_manager, SHARED_EXECUTORS)


def _connect_session(manager, kind, monkeypatch):
    reason = connect_available()
    if reason:
        pytest.skip(f"Spark Connect: {reason}")
    spark = manager.connect(kind)
    # As after SparkSession.builder.remote(...) in a user's process: pyspark.sql.utils.is_remote() is True,
    # so pyspark.sql.functions build Connect columns (the classic session waits unused meanwhile).
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    yield spark
    try:
        spark.interruptAll()  # a failed test may leave a job running
    except Exception:  # noqa: BLE001
        pass


@pytest.fixture
def spark_connect(spark_manager, monkeypatch):
    """A Spark Connect client session; its server drives local[2]."""
    yield from _connect_session(spark_manager, CONNECT_LOCAL, monkeypatch)


@pytest.fixture
def spark_connect_standalone(spark_manager, monkeypatch):
    """A Spark Connect client session; its server drives the standalone cluster (two 1-core workers)."""
    yield from _connect_session(spark_manager, CONNECT_STANDALONE, monkeypatch)


@pytest.fixture
def standalone_cluster(spark_manager, request):
    cluster = spark_manager.standalone()
    if "spark_standalone" not in request.fixturenames and spark_manager.kind == STANDALONE:
        spark_manager.stop()  # our app would hold every core of the cluster
    return cluster


@pytest.fixture
def spark_standalone(spark_manager, standalone_cluster):
    yield from _session(spark_manager, STANDALONE)


@pytest.fixture
def spark_two_hosts(spark_manager):
    import two_hosts

    reason = two_hosts.available()
    if reason:
        pytest.skip(f"two hosts in network namespaces: {reason}")
    yield from _session(spark_manager, TWO_HOSTS)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_jvm(request):
    """A test in tests/unit needs no JVM: one that starts a Spark gateway belongs in tests/spark."""
    had_gateway = SparkContext._gateway is not None
    yield
    if request.node.get_closest_marker("unit") is not None and not had_gateway:
        assert SparkContext._gateway is None, f"{request.node.nodeid} started a JVM: move it to tests/spark"


# -- rank work dirs -------------------------------------------------------------------------------------------
# A rank's work dir (spark_dist.task.barrier_task: spark_dist-rank-<pid>-<run_id>-<attempt>-r<rank>-XXXX, made by
# spark_dist.host.tempdirs) is removed by the process that made it when the rank's task ends; while it lives,
# that process holds a flock on its .owner file. A dir still there and still held after its test is one a live
# process (a reused Python worker, the driver in local mode) forgot to remove: the check below fails the test. A
# dir whose owner died (a Python worker or an executor a test killed on purpose: SIGKILL runs no cleanup) is
# left for the next run's sweep, as in production; those still there at the end are listed in the summary.
RANK_DIR_PREFIX = "spark_dist-rank-"
RANK_DIR_GRACE_S = 30  # a cancelled task removes its dirs a little after its run() raised
_swept_rank_dirs = []  # left by owners that died, removed at the end of the session


def _rank_dir_parents():
    """Where the processes of the tests make their temp dirs: this run's temp dir, and each namespace host's."""
    hosts = getattr(_manager, "hosts_cluster", None)
    return [RUN_TEMP_DIR, *(getattr(hosts, "host_tmp", {}) or {}).values()]


def rank_work_dirs():
    found = set()
    for parent in _rank_dir_parents():
        try:
            found.update(os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(RANK_DIR_PREFIX))
        except OSError:
            pass
    return found


def _held(path):
    """Whether a live process holds ``path``'s lock (never takes it for longer than the check)."""
    import fcntl

    try:
        fd = os.open(os.path.join(path, ".owner"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone meanwhile
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the owner holds LOCK_EX
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def held_rank_work_dirs(paths, grace=RANK_DIR_GRACE_S):
    """Those of ``paths`` still there and held by a live process after ``grace`` seconds (or once none is)."""
    deadline = time.monotonic() + grace
    while True:
        held = sorted(p for p in paths if os.path.isdir(p) and _held(p))
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _rank_work_dirs_go_with_their_tasks(request):
    before = rank_work_dirs()
    yield
    made = rank_work_dirs() - before
    if not made:
        return
    held = held_rank_work_dirs(made)
    if held:
        pytest.fail(f"{request.node.nodeid}: rank work dirs left behind by a live process (their owner holds "
                    f"them {RANK_DIR_GRACE_S} s after the test; a rank's task removes its dir when it ends):\n"
                    + "\n".join(f"  {p}" for p in held), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_processes():
    """After every other session fixture is torn down: no Spark process of ours may remain, and no rank work dir
    either (every dir left by a dead owner is swept now, and listed at the end of the run)."""
    yield
    parents = _rank_dir_parents()
    _shutdown()
    leaks = wait_for_no_leaks(MARKER)
    from spark_dist.host import tempdirs

    left = held_rank_work_dirs(rank_work_dirs(), grace=5)  # only this process can still hold one (local mode)
    for parent in parents:
        _swept_rank_dirs.extend(tempdirs.sweep("rank", parent))
    shutil.rmtree(RUN_TEMP_DIR, ignore_errors=True)
    if leaks:
        msg = describe(leaks)
        for p in leaks:  # all of them were started by this session (descendant or marker)
            p.kill()
        pytest.fail("LEAKED PROCESSES after stopping every Spark set-up (killed now):\n" + msg,
                    pytrace=False)
    if left:
        pytest.fail("rank work dirs still held by this process after every Spark set-up stopped:\n"
                    + "\n".join(f"  {p}" for p in left), pytrace=False)


def pytest_terminal_summary(terminalreporter):
    if _swept_rank_dirs:
        terminalreporter.write_line(
            f"rank work dirs left by owners that died (tests kill Python workers and executors on purpose), swept "
            f"at the end: {len(_swept_rank_dirs)}", yellow=True)
        for path in _swept_rank_dirs:
            terminalreporter.write_line(f"  {os.path.basename(path)}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Safety net for interrupted runs: fixtures are torn down by now; stop and check again."""
    _shutdown()
    leaks = wait_for_no_leaks(MARKER, timeout=15)
    if leaks:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "LEAKED PROCESSES at session end (killed now):\n" + describe(leaks)
        if tr is not None:
            tr.write_line(msg, red=True, bold=True)
        else:
            print(msg, file=sys.stderr)
        for p in leaks:
            p.kill()
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """A Spark-aware per-test timeout.

    pytest-timeout's signal method cannot interrupt a test blocked in a py4j call (the process-wide
    SIGALRM lands on any of PySpark's threads; interrupting the main thread mid-call would also leave
    its py4j connection out of sync), and its thread method ends the whole run at once. Instead:
    cancel every Spark job, so the test's blocked call raises and teardown runs normally; if the test
    is stuck elsewhere, fall back to the thread method (stack dump, os._exit; the JVMs die with us).
    """
    finished = threading.Event()

    def fire():
        tw = item.config.get_terminal_writer()
        tw.sep("+", f"Timeout >{settings.timeout}s: cancelling all Spark jobs")
        pytest_timeout.dump_stacks(tw)
        sc = SparkContext._active_spark_context
        if sc is not None:
            try:
                sc.cancelAllJobs()  # from this thread: its own py4j connection
            except Exception as e:
                tw.line(f"cancelAllJobs failed: {e!r}")
        if not finished.wait(60):
            pytest_timeout.timeout_timer(item, settings)

    timer = threading.Timer(settings.timeout, fire)
    timer.daemon = True

    def cancel():  # called by pytest-timeout when the test is over
        finished.set()
        timer.cancel()

    item.cancel_timeout = cancel
    timer.start()
    return True
