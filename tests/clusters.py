"""Real Spark set-ups for the tests: local[2], local-cluster with fake GPUs, and a standalone cluster.

PySpark allows one active SparkContext per Python process, so `SparkManager` keeps at most one
SparkSession alive and switches kinds on demand. Everything started here binds 127.0.0.1 and is
stopped by pid / process group; `find_leaks` checks that nothing outlives the test session.
"""
import ctypes
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import psutil
import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
SPARK_4 = int(pyspark.__version__.split(".")[0]) >= 4  # the Spark line these tests run on
HERE = os.path.dirname(os.path.abspath(__file__))
LOCAL, LOCAL_CLUSTER, STANDALONE, TWO_HOSTS = "local", "local_cluster", "standalone", "two_hosts"
SHARED_EXECUTORS = "shared_executors"  # local-cluster, two executors of two cores: ranks share an executor
MULTI_GPU_TASKS = "multi_gpu_tasks"  # local-cluster, two executors of 1 core and 2 fake GPUs; 2 GPUs per task
# Spark Connect servers (tests/connect_server.py), in front of local[2] or of the standalone cluster.
CONNECT_LOCAL, CONNECT_STANDALONE = "connect_local", "connect_standalone"
# Every process this test session starts inherits this variable (JVMs pass their environment on to
# executors and Python daemons), which lets the leak check find orphans whose parent already died.
SESSION_MARKER = "SPARK_DIST_TEST_SESSION"
# Processes that must not outlive a test run: Spark's JVMs and Python workers, and spark_dist's own: the
# spark_dist_daemon of local[2] and every worker and rank forked from it (`python -m spark_dist_daemon`),
# local-mode ranks (`python -m spark_dist.task.local_rank`), transform workers (`python -c BOOT`, whose code
# imports spark_dist.data.read.transform_process) and `python -m spark_dist run`.
SPARK_PATTERNS = ("org.apache.spark.", "pyspark.daemon", "pyspark.worker", "pyspark/daemon.py", "spark_dist")

N_EXECUTORS = {LOCAL: 0, LOCAL_CLUSTER: 2, SHARED_EXECUTORS: 2, MULTI_GPU_TASKS: 2, STANDALONE: 2, TWO_HOSTS: 2}  # executors besides the driver


# Every test session's conf (the Connect server's too): loopback only, small, quick to give up.
TEST_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.python.worker.reuse": "true",
    "spark.executor.memory": "1g",
    # Too few slots for a barrier stage otherwise re-checks every 15 s, 40 times.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "10",
    # Small enough that a test can return a result over it (test_result.py).
    "spark.driver.maxResultSize": "64m",
}


def free_port():
    """A port free on 127.0.0.1 now, for a JVM to listen on: from this Spark line's own range (free_ports.py),
    not the kernel's ephemeral range, where any outgoing connection of either line's suite may take it first."""
    from free_ports import free_ports

    return free_ports(1)


def _wait_for(what, check, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def running(pids):
    """Those of ``pids`` still running: a zombie has exited (only its parent has not reaped it yet)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def still_running_after(pids, timeout=20):
    """Those of ``pids`` still running once they all exited or ``timeout`` seconds passed: processes being
    stopped may take more than a fixed second on a loaded machine (the suite runs both Spark lines at once)."""
    deadline = time.monotonic() + timeout
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running(pids)


_libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here: the forked child only calls it


_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clusters-spawner")  # a thread that stays


def _die_with_parent():
    """preexec_fn: SIGTERM the child if pytest dies without cleaning up (kill -9, os._exit).

    Survives the exec in spark-class; the JVM's shutdown hooks then stop its executors. (Linux
    sends it when the forking *thread* ends: start clusters from the main thread.)
    """
    PR_SET_PDEATHSIG = 1
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def install_gpu_script(tmpdir):
    """Copy the discovery script into tmpdir with its exec bit (Spark runs it directly)."""
    dst = os.path.join(tmpdir, "fake_gpu_discovery.sh")
    shutil.copy(os.path.join(HERE, "fake_gpu_discovery.sh"), dst)
    os.chmod(dst, 0o755)
    return dst


class StandaloneCluster:
    """A standalone master plus workers (1 core, 2g, 1 fake GPU each), each its own process group."""

    def __init__(self, tmpdir, gpu_script, n_workers=2, cores=1, memory="2g"):
        self.tmpdir, self.gpu_script = tmpdir, gpu_script
        self.n_workers, self.cores, self.memory = n_workers, cores, memory
        self.master = None  # Popen
        self.workers = []  # Popen
        self.master_url = self.webui_url = None
        self.spark_home = SPARK_HOME
        self.spark_submit = os.path.join(SPARK_HOME, "bin", "spark-submit")

    @property
    def master_pid(self):
        return self.master.pid

    @property
    def worker_pids(self):
        return [w.pid for w in self.workers]

    def _spawn(self, name, args, extra_env=None, prefix=()):
        """Start ``spark-class args`` (after ``prefix``, e.g. ``ip netns exec NS``) in its own group, with the
        parent-death signal SIGTERM. Set by ``setpriv`` where it is installed (util-linux), not a ``preexec_fn``:
        Python code run in the forked child (after CPython cleared its copies of the parent's other threads) lets
        py4j's thread-local finalizers close those threads' gateway connections, and their ``close()`` shuts down
        the socket the child shares with the parent: a driver between two py4j calls (a run waiting for a
        replaced worker's slots) then fails its next one (``Py4JError``, connection reset; the fault campaign's
        decommission found it)."""
        log = open(os.path.join(self.tmpdir, f"{name}.log"), "ab")
        env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", **(extra_env or {})}
        setpriv = shutil.which("setpriv")
        with log:
            return subprocess.Popen(
                [*([setpriv, "--pdeathsig", "TERM"] if setpriv else []), *prefix,
                 os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=None if setpriv else _die_with_parent,
            )

    def _alive_workers(self):
        with urllib.request.urlopen(self.webui_url + "/json/", timeout=5) as r:
            state = json.load(r)
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def is_running(self):
        procs = [self.master, *self.workers]
        return self.master is not None and all(p.poll() is None for p in procs)

    def start(self):
        port, ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.webui_url = f"http://127.0.0.1:{ui_port}"
        self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master",
                                             "--host", "127.0.0.1", "--port", str(port),
                                             "--webui-port", str(ui_port)])
        for i in range(self.n_workers):
            self.workers.append(self._spawn_worker(i))
        try:
            self._wait_for_workers("standalone workers to register", timeout=90)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_worker(self, i, generation=0):
        work_dir = os.path.join(self.tmpdir, f"worker{i}-{generation}")
        os.makedirs(work_dir, exist_ok=True)
        props = os.path.join(self.tmpdir, f"worker{i}.properties")
        with open(props, "w") as f:
            # The worker's own resources: one fake GPU, address i. Decommission on: SIGPWR (what
            # sbin/decommission-worker.sh sends) decommissions the worker instead of ending its JVM.
            f.write(f"spark.worker.resource.gpu.amount 1\n"
                    f"spark.worker.resource.gpu.discoveryScript {self.gpu_script}\n"
                    "spark.decommission.enabled true\n")
        return self._spawn(
            f"worker{i}",
            ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", str(self.cores), "--memory", self.memory,
             "--webui-port", str(free_port()), "--work-dir", work_dir,
             "--properties-file", props, self.master_url],
            extra_env={"FAKE_GPU_ADDRESS": str(i)})

    def replace_worker(self, i):
        """Stop worker ``i`` with its executors (a decommissioned machine going away) and start a new one in its
        place (the machine coming back), once the master has it ALIVE. From any thread: the new worker is forked
        by a thread that lives as long as this process (its parent-death signal follows the forking thread)."""
        old = self.workers[i]
        _signal_group(old, signal.SIGKILL)
        old.wait()
        self._generation = getattr(self, "_generation", 0) + 1
        self.workers[i] = _SPAWNER.submit(self._spawn_worker, i, self._generation).result()
        self._wait_for_workers("the new standalone worker to register", timeout=90)

    def kill_worker(self, i):
        """Worker ``i`` and its executors gone for good (a machine lost and never replaced): SIGKILL to its
        process group. The cluster no longer counts as running (:meth:`is_running`), so the next test that asks
        SparkManager for it gets a new one."""
        _signal_group(self.workers[i], signal.SIGKILL)
        self.workers[i].wait()

    def _wait_for_workers(self, what, timeout):
        """Until every worker is ALIVE on the master; fails at once if one of our JVMs exited."""
        def ready():
            if not self.is_running():
                raise RuntimeError(f"a standalone JVM exited early; see logs in {self.tmpdir}")
            try:
                return len(self._alive_workers()) == self.n_workers
            except (OSError, ValueError):  # master UI not up yet (no answer, or an empty page while starting)
                return False

        _wait_for(what, ready, timeout=timeout, interval=0.5)

    def executor_pids(self, worker=None):
        """Executor JVMs the workers run now (children of the worker JVMs), or worker ``worker``'s alone."""
        pids = []
        for w in self.workers if worker is None else [self.workers[worker]]:
            try:
                children = psutil.Process(w.pid).children(recursive=True)
            except psutil.Error:
                continue
            for c in children:
                try:  # zombies (e.g. the finished discovery script) have no cmdline
                    if "CoarseGrainedExecutorBackend" in " ".join(c.cmdline()):
                        pids.append(c.pid)
                except psutil.Error:
                    pass
        return pids

    def stop(self):
        """SIGTERM each process group (worker shutdown hooks stop executors), then SIGKILL."""
        procs = [p for p in [*self.workers, self.master] if p is not None]
        for p in procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # Whatever is left of the group (executors, Python daemons) goes now.
            _signal_group(p, signal.SIGKILL)
            p.wait()
        self.master, self.workers = None, []


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)  # pgid == pid: start_new_session made it the group leader
    except (ProcessLookupError, PermissionError):
        pass


class SparkManager:
    """Holds at most one SparkSession; `get(kind)` switches kinds by stopping the old one."""

    def __init__(self, tmpdir):
        self.tmpdir = tmpdir
        self.gpu_script = install_gpu_script(tmpdir)
        self.gpu_counter = os.path.join(tmpdir, "gpu_counter")
        self.two_gpu_script = os.path.join(tmpdir, "two_fake_gpus.sh")  # workers of two GPUs each
        with open(self.two_gpu_script, "w") as f:
            f.write(f"#!/usr/bin/env bash\nFAKE_GPUS_PER_WORKER=2 exec {self.gpu_script}\n")
        os.chmod(self.two_gpu_script, 0o755)
        # The local-cluster driver's two GPUs, always "0" and "1": a fixed address leaves the workers' counter alone.
        self.driver_gpu_script = os.path.join(tmpdir, "driver_fake_gpus.sh")
        with open(self.driver_gpu_script, "w") as f:
            f.write(f"#!/usr/bin/env bash\nFAKE_GPU_ADDRESS=0 FAKE_GPUS_PER_WORKER=2 exec {self.gpu_script}\n")
        os.chmod(self.driver_gpu_script, 0o755)
        os.environ["FAKE_GPU_COUNTER"] = self.gpu_counter  # read by local-cluster workers
        self.kind = None
        self.spark = None
        self.cluster = None  # StandaloneCluster, started lazily
        self.hosts_cluster = None  # two_hosts.TwoHostCluster, started lazily (root only)
        self.connect_server = None  # connect_server.ConnectServer, one at a time, started lazily
        self.connect_kind = None
        self.connect_spark = None  # its client session

    def standalone(self):
        if self.cluster is None or not self.cluster.is_running():
            if self.cluster is not None:  # a test killed a master/worker JVM: start afresh
                if self.kind == STANDALONE:
                    self.stop()
                self.cluster.stop()
            d = os.path.join(self.tmpdir, f"standalone-{time.time_ns()}")
            os.makedirs(d)
            self.cluster = StandaloneCluster(d, self.gpu_script).start()
        return self.cluster

    def two_hosts(self):
        from two_hosts import TwoHostCluster

        if self.hosts_cluster is None or not self.hosts_cluster.is_running():
            if self.hosts_cluster is not None:
                if self.kind == TWO_HOSTS:
                    self.stop()
                self.hosts_cluster.stop()
            if self.cluster is not None:  # free the cores: the loopback cluster restarts if a test asks
                if self.connect_kind == CONNECT_STANDALONE:
                    self.stop_connect()
                if self.kind == STANDALONE:
                    self.stop()
                self.cluster.stop()
                self.cluster = None
            d = os.path.join(self.tmpdir, f"two-hosts-{time.time_ns()}")
            os.makedirs(d)
            self.hosts_cluster = None
            self.hosts_cluster = TwoHostCluster(d, self.gpu_script).start()
        return self.hosts_cluster

    def _conf(self, kind):
        conf = dict(TEST_CONF)
        if kind == LOCAL:
            conf["spark.master"] = "local[2]"
            # Named, as `spark-dist run` names it: else the first test that trains would choose it for every later
            # test (spark_dist.spark.python_daemon), whichever test that is.
            conf["spark.python.daemon.module"] = "spark_dist_daemon"
        elif kind == LOCAL_CLUSTER:
            conf.update({
                "spark.master": "local-cluster[2,1,1024]",
                "spark.test.home": SPARK_HOME,  # where the executors find bin/ and jars/
                # GPUs belong to the (in-JVM) workers: without spark.worker.resource.* the master
                # never launches an executor that asks for a GPU. Executors get their addresses
                # from the worker (a resources file), so no executor discovery script is needed.
                "spark.worker.resource.gpu.amount": "1",
                "spark.worker.resource.gpu.discoveryScript": self.gpu_script,
                "spark.executor.resource.gpu.amount": "1",
                "spark.task.resource.gpu.amount": "1",
                # The driver's own GPUs, which local-mode runs take (PySpark's TorchDistributor's way).
                "spark.driver.resource.gpu.amount": "2",
                "spark.driver.resource.gpu.discoveryScript": self.driver_gpu_script,
            })
        elif kind == MULTI_GPU_TASKS:
            conf.update({
                "spark.master": "local-cluster[2,1,1024]",
                "spark.test.home": SPARK_HOME,
                "spark.worker.resource.gpu.amount": "2",
                "spark.worker.resource.gpu.discoveryScript": self.two_gpu_script,
                "spark.executor.resource.gpu.amount": "2",
                "spark.task.resource.gpu.amount": "2",
            })
        elif kind == SHARED_EXECUTORS:
            conf.update({"spark.master": "local-cluster[2,2,1024]", "spark.test.home": SPARK_HOME})
        elif kind == STANDALONE:
            # Decommission on, as a cluster that may take executors away has it: a decommissioned worker's
            # executors finish their tasks and exit (tests/spark/test_elastic_runs.py).
            conf.update({"spark.master": self.standalone().master_url, "spark.decommission.enabled": "true"})
        elif kind == TWO_HOSTS:
            from two_hosts import DRIVER_IP

            conf.update({"spark.master": self.two_hosts().master_url, "spark.driver.host": DRIVER_IP,
                         "spark.driver.bindAddress": DRIVER_IP})
        else:
            raise ValueError(kind)
        return conf

    def _is_alive(self):
        sc = SparkContext._active_spark_context
        return self.spark is not None and sc is not None and sc is self.spark.sparkContext

    def get(self, kind):
        if kind == STANDALONE and self.cluster is not None and not self.cluster.is_running():
            self.standalone()  # restarts the cluster (and drops the session on it)
        if self.kind == kind and self._is_alive():
            self.wait_for_executors()  # a test may have killed some
            return self.spark
        self.stop()
        if kind in (LOCAL_CLUSTER, MULTI_GPU_TASKS) and os.path.exists(self.gpu_counter):
            os.remove(self.gpu_counter)  # new workers get GPUs 0, 1, ... again
        builder = SparkSession.builder.appName(f"spark_dist-tests-{kind}")
        for k, v in self._conf(kind).items():
            builder = builder.config(k, v)
        self.spark, self.kind = builder.getOrCreate(), kind
        self.spark.sparkContext.setLogLevel("WARN")
        self.wait_for_executors()
        self._warm_up()
        return self.spark

    def wait_for_executors(self, timeout=120):
        n = N_EXECUTORS[self.kind]
        jsc = self.spark.sparkContext._jsc.sc()
        # getExecutorMemoryStatus counts the driver too.
        _wait_for(f"{n} executors", lambda: jsc.getExecutorMemoryStatus().size() - 1 >= n, timeout)

    def _warm_up(self):
        """One barrier task per slot: each executor starts its Python daemon now, not in a test; the daemon
        that runs and UDFs use (a barrier mapInArrow job, as a run's), not a plain RDD job's."""
        n = max(2, N_EXECUTORS[self.kind]) * (2 if self.kind == SHARED_EXECUTORS else 1)
        self.spark.range(0, n, 1, n).mapInArrow(lambda batches: batches, "id long", barrier=True).collect()

    def stop(self):
        """Stop our session, and any SparkContext a test made itself (getOrCreate would reuse it)."""
        self.spark, self.kind = None, None
        sc = SparkContext._active_spark_context
        if sc is None:
            return
        try:
            sc.stop()
        except Exception:  # a broken JVM (e.g. a test timed out mid-call): start from scratch
            stop_gateway()

    def connect(self, kind):
        """A Connect client session of a server in front of ``kind`` (CONNECT_LOCAL or CONNECT_STANDALONE),
        started once and kept for the tests of that kind; its executors are up and warm."""
        from connect_server import ConnectServer

        if self.connect_kind == kind and self.connect_server is not None and self.connect_server.is_running() \
                and (kind != CONNECT_STANDALONE or self.cluster is not None and self.cluster.is_running()):
            return self.connect_spark
        self.stop_connect()
        if kind == CONNECT_STANDALONE:
            if self.kind == STANDALONE:
                self.stop()  # our classic app would hold every core of the cluster
            master = self.standalone().master_url
        else:
            master = "local[2]"
        d = os.path.join(self.tmpdir, f"{kind}-{time.time_ns()}")
        os.makedirs(d)
        self.connect_server = ConnectServer(d, master).start()
        self.connect_kind, self.connect_spark = kind, self.connect_server.session()
        _wait_for("the Connect server's executors", lambda: _barrier_job_runs(self.connect_spark), timeout=120,
                  interval=1.0)
        return self.connect_spark

    def stop_connect(self):
        server, self.connect_server, self.connect_kind, self.connect_spark = self.connect_server, None, None, None
        if server is not None:
            server.stop()

    def shutdown(self):
        try:
            self.stop_connect()
        except Exception:  # noqa: BLE001 -- the rest must still go
            pass
        clusters = [c for c in (self.cluster, self.hosts_cluster) if c is not None]
        self.cluster = self.hosts_cluster = None
        try:
            self.stop()  # the app first, so that its executors end cleanly
        finally:
            try:
                for cluster in clusters:
                    cluster.stop()
            finally:
                stop_gateway()


def _barrier_job_runs(spark):
    """One barrier task per slot through Connect (so each executor starts its Python daemon now, not in a
    test); False while the executors are still registering."""
    def one(batches):
        for batch in batches:
            yield batch

    try:
        return spark.range(0, 2, 1, 2).mapInArrow(one, "id long", barrier=True).count() == 2
    except Exception:  # noqa: BLE001 -- too few slots yet
        return False


def connect_available():
    """``None`` when this pyspark can run a Spark Connect server and client, else the reason."""
    import glob

    if not glob.glob(os.path.join(SPARK_HOME, "jars", "spark-connect_*.jar")):
        return f"pyspark {pyspark.__version__} ships no Spark Connect server (the 3.5 wheel has none)"
    try:
        import grpc  # noqa: F401
        from pyspark.sql.connect.session import SparkSession as _  # noqa: F401
    except ImportError as exc:
        return f"the Spark Connect client cannot be imported: {exc}"
    return None


def stop_gateway():
    """Stop any SparkContext and the py4j gateway JVM (SparkContext.stop leaves the JVM running)."""
    sc = SparkContext._active_spark_context
    if sc is not None:
        try:
            sc.stop()
        except Exception:
            pass  # the JVM goes below anyway
        SparkContext._active_spark_context = None
    gw = SparkContext._gateway
    if gw is None:
        return
    proc = getattr(gw, "proc", None)
    try:
        gw.shutdown()
    except Exception:
        pass
    if proc is not None:
        # The gateway JVM exits when its stdin closes.
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def _is_spark_process(p):
    cmd = " ".join(p.info["cmdline"] or [])
    return any(s in cmd for s in SPARK_PATTERNS)


def find_leaks(marker_value):
    """Spark/PySpark processes started by this test session that are still running: descendants
    of pytest, or processes carrying our marker (orphans re-parented away from us). Never a
    recorded pid alone: once reaped, a pid may belong to someone else's process."""
    me = psutil.Process()
    mine = {c.pid for c in me.children(recursive=True)}
    leaks = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.pid == me.pid or p.info["status"] == psutil.STATUS_ZOMBIE or not _is_spark_process(p):
            continue
        try:
            if p.pid in mine or p.environ().get(SESSION_MARKER) == marker_value:
                leaks.append(p)
        except psutil.Error:  # not ours to read, or gone
            pass
    return leaks


def wait_for_no_leaks(marker_value, timeout=30):
    """Processes exit a little after their driver stops; give them time, then report what is left."""
    deadline = time.monotonic() + timeout
    while True:
        leaks = find_leaks(marker_value)
        if not leaks or time.monotonic() > deadline:
            return leaks
        time.sleep(0.5)


def describe(procs):
    out = []
    for p in procs:
        try:
            out.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:300]}")
        except psutil.Error:
            out.append(f"  pid {p.pid}: (gone)")
    return "\n".join(out)

