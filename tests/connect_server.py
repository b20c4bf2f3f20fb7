"""A Spark Connect server for the tests: ``spark-submit --class ...SparkConnectServer`` in its own process group.

The server is the Spark driver (master ``local[2]``, a standalone master URL, ...); the test process talks
to it as a Connect client (gRPC, no JVM on the client side). A client session made by :meth:`session` can
live next to the classic SparkContext the test process holds: it is made with the Connect builder itself
(``pyspark.sql.connect.session.SparkSession.builder.remote(url).create()``), which, unlike
``pyspark.sql.SparkSession.builder.remote(url)``, neither refuses to run beside a classic context nor
sets ``SPARK_CONNECT_MODE_ENABLED`` (that variable would turn ``pyspark.sql.utils.is_remote()`` on for the
whole process, and every ``pyspark.sql.functions`` call of the classic session into a Connect one).

Everything binds 127.0.0.1 and is stopped by process group, like ``StandaloneCluster`` in clusters.py.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

from clusters import SESSION_MARKER, SPARK_HOME, TEST_CONF, _die_with_parent, _signal_group, _wait_for, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Variables that would make the server's own PySpark/launcher behave as a Connect client, or are the
# gateway plumbing of this process's classic context.
_CLIENT_ONLY_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE",
                    "PYSPARK_SUBMIT_ARGS", "_PYSPARK_DRIVER_CONN_INFO_PATH", "PYSPARK_GATEWAY_PORT",
                    "PYSPARK_GATEWAY_SECRET", "SPARK_CONNECT_AUTHENTICATE_TOKEN")


class ConnectServer:
    """A Spark Connect server driving ``master``; logs to ``<tmpdir>/connect-server.log``.

    ``conf`` adds to (or overrides) the defaults below, which match ``SparkManager._conf``.
    """

    def __init__(self, tmpdir, master, conf=None, startup_timeout=180):
        self.tmpdir, self.master = tmpdir, master
        self.startup_timeout = startup_timeout
        self.extra_conf = dict(conf or {})
        self.port = None
        self.proc = None  # Popen of spark-submit (exec'd into the driver JVM)
        self.log_path = os.path.join(tmpdir, "connect-server.log")
        self.spark_home = SPARK_HOME
        self.spark_submit = os.path.join(SPARK_HOME, "bin", "spark-submit")
        self._sessions = []

    # ------------------------------------------------------------------------------------------------
    @property
    def url(self):
        if self.port is None:
            raise RuntimeError("the Connect server is not started")
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self):
        return None if self.proc is None else self.proc.pid

    def conf(self):
        conf = {
            **TEST_CONF,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.log.level": "WARN",  # as SparkManager's sessions; "INFO" to see every job and task
            # The Python that runs UDFs / mapInArrow: the Connect planner reads PYSPARK_PYTHON from the
            # server's environment (set below); executors on other machines read this conf.
            "spark.pyspark.python": sys.executable,
        }
        marker = os.environ.get(SESSION_MARKER)
        if marker:  # executors of a cluster this process did not start still carry the leak marker
            conf[f"spark.executorEnv.{SESSION_MARKER}"] = marker
        conf.update(self.extra_conf)
        return conf

    def is_running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        if self.is_running():
            return self
        self.port = free_port()
        cmd = [self.spark_submit, "--class", SERVER_CLASS, "--name", "spark_dist-tests-connect",
               "--master", self.master]
        for k, v in self.conf().items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")
        env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ONLY_ENV}
        env.update({
            "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONNECT_MODE": "0",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
        })
        with open(self.log_path, "ab") as log:
            # cwd: the server's spark-warehouse/ and metastore_db/ go to tmpdir, not where pytest runs.
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, cwd=self.tmpdir, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_serving(self):
        deadline = time.monotonic() + self.startup_timeout

        def port_open():
            if not self.is_running():
                raise RuntimeError(f"the Spark Connect server exited early (code {self.proc.returncode}); "
                                   f"see {self.log_path}:\n{self.log_tail()}")
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        try:
            _wait_for(f"the Spark Connect server on {self.url}", port_open, timeout=self.startup_timeout)
            # The port opens once the gRPC service runs; a first query proves the session machinery does.
            # The probe session is stopped right after: the first session a process creates becomes its
            # default and active one (what SparkSession.getActiveSession() returns, as spark_dist's
            # Distributor does when no session is passed), and that must be the session a test uses. (The
            # client's asynchronous ReleaseExecute may then reach a closed session: a harmless ERROR in the log.)
            spark = self._new_session()
            try:
                left = max(deadline - time.monotonic(), 10.0)
                _wait_for("a first query", lambda: self._answers(spark), timeout=left, interval=1.0)
            finally:
                spark.stop()
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; see {self.log_path}:\n{self.log_tail()}") from None

    def _answers(self, spark):
        if not self.is_running():
            raise RuntimeError(f"the Spark Connect server exited (code {self.proc.returncode}); "
                               f"see {self.log_path}:\n{self.log_tail()}")
        try:
            return spark.range(1).count() == 1
        except Exception:  # noqa: BLE001 -- not ready yet; the log says why if it never is
            return False

    def log_tail(self, n=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------------------------------------
    def _new_session(self):
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        return ConnectSession.builder.remote(self.url).create()

    def session(self):
        """A new Connect client session (its own server-side session); :meth:`stop` stops it too. The first
        one made (while no other is open in this process) is the process's active session."""
        if not self.is_running():
            raise RuntimeError(f"the Spark Connect server is not running; see {self.log_path}")
        spark = self._new_session()
        self._sessions.append(spark)
        return spark

    def stop(self):
        """Stop our client sessions, then the server: SIGTERM its group (shutdown hooks stop the
        SparkContext, its Python daemons and, on a cluster, its executors), then SIGKILL what is left."""
        sessions, self._sessions = self._sessions, []
        for spark in sessions:
            try:
                spark.stop()  # best effort by design; never raises
            except Exception:  # noqa: BLE001
                pass
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            # The Python daemons make their own process groups: remember every descendant now.
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        # psutil.Process checks its creation time: a recycled pid is never signalled.
        _, alive = psutil.wait_procs(descendants, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
