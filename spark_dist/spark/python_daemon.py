"""Which daemon forks a local session's Python workers: :mod:`spark_dist_daemon` where it can serve them, PySpark's
own elsewhere.

``spark_dist_daemon`` is PySpark's daemon, run after dropping Spark's zips of the installed PySpark from its path
(its docstring says why: 1.2-1.7 s of a core, on the first Python job of every session). Spark reads
``spark.python.daemon.module`` when it starts a daemon, so it reaches a session two ways:

- a session spark_dist starts (``spark-dist run``, the demo) names it in its conf (:func:`conf_default`);
- a local session you started yourself gets it at its first training run or fit (:func:`use_in_session`), set
  in the running SparkContext's conf, where the session has started no Python worker yet.

Either way only where the workers run this environment's interpreter, which finds the module: a Python that
could not import it would start no Python task of the session at all.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import Dict, NamedTuple, Optional

from . import jvm, session

log = logging.getLogger(__name__)

KEY = "spark.python.daemon.module"
MODULE = "spark_dist_daemon"

_decided_for: set = set()  # applicationIds: the choice is made once per SparkContext


class WorkersStart(NamedTuple):
    """What a Spark JVM starts Python workers with: the ``PATH`` it finds ``python3`` on, the ``PYTHONPATH``
    they get after Spark's zips, and the working directory they start in (``python -m`` puts it first)."""
    path: str
    pythonpath: str
    cwd: str

    @classmethod
    def of_this_process(cls, conf: Dict[str, str]) -> "WorkersStart":
        """As a JVM about to start from this process would (it inherits the environment)."""
        return cls(os.environ.get("PATH", ""), _pythonpath(conf, os.environ.get("PYTHONPATH")), os.getcwd())

    @classmethod
    def of_context(cls, sc, conf: Dict[str, str]) -> "WorkersStart":
        """As ``sc``'s running JVM does: its own environment, not this process's (a notebook may change it)."""
        system = sc._jvm.java.lang.System
        return cls(system.getenv("PATH") or "", _pythonpath(conf, system.getenv("PYTHONPATH")),
                   system.getProperty("user.dir"))


def _pythonpath(conf: Dict[str, str], inherited: Optional[str]) -> str:
    # Spark puts spark.executorEnv.PYTHONPATH before the environment's (PythonWorkerFactory).
    return os.pathsep.join(p for p in (conf.get("spark.executorEnv.PYTHONPATH"), inherited) if p)


def runs_this_environment(workers_python: str, start: WorkersStart) -> bool:
    """Whether ``workers_python`` (a path, or a name looked up on ``start.path`` as Spark does: PySpark's
    default is ``python3``) is this interpreter in this environment's folder, and, started as Spark starts a
    daemon, finds spark_dist_daemon.

    The folder is compared as given, not resolved: two virtual environments' pythons link to one interpreter.
    Finding the module is asked of the workers' Python itself, in ``start``'s working directory and
    ``PYTHONPATH`` (a few dozen milliseconds): this process's path may hold what theirs does not (a script's
    folder, a notebook's ``sys.path.insert``), and an editable install made before the module existed lacks it.
    """
    found = workers_python if os.sep in workers_python else shutil.which(workers_python, path=start.path)
    if not found:
        return False
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(found)
    if os.path.dirname(there) != os.path.dirname(here) or os.path.realpath(there) != os.path.realpath(here):
        return False
    env = dict(os.environ, PYTHONPATH=start.pythonpath)
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({MODULE!r}) is None)"
    try:
        return subprocess.run([there, "-c", probe], cwd=start.cwd or None, env=env, timeout=60,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def conf_default(conf: Dict[str, str], workers_python: str, start: Optional[WorkersStart] = None) -> Optional[str]:
    """The daemon module for a session with ``conf`` whose local workers run ``workers_python``, started as
    ``start`` says (default: as a JVM started from this process): :data:`MODULE` on a local master
    (``local``, ``local[...]``, ``local-cluster[...]``: every executor runs on this machine) where
    :func:`runs_this_environment`, unless ``conf`` names a daemon or runs none (``spark.python.use.daemon=false``);
    else ``None``."""
    if (KEY in conf or not conf.get("spark.master", "").startswith("local")
            or conf.get("spark.python.use.daemon", "true").strip().lower() == "false"):
        return None
    start = start or WorkersStart.of_this_process(conf)
    return MODULE if runs_this_environment(workers_python, start) else None


def use_in_session(spark) -> bool:
    """Have ``spark``'s Python daemon import the installed PySpark from now on, where that is safe; once per
    SparkContext. Returns whether it set :data:`KEY`. Raises nothing: where anything fails to answer (a JVM
    before Java 9 has no ``ProcessHandle``), the session is left as it is.

    It does on a classic session with a ``local``/``local[...]`` master (its executors share the driver's JVM,
    and so its conf) where :func:`conf_default` would choose it for the running JVM's workers
    (``PYSPARK_PYTHON``, else ``python3`` on the JVM's ``PATH``), and no Python daemon or worker has started yet:
    a running daemon keeps serving its workers on Spark 3.5 (it reads the key once), and on 4 a second one would
    start beside it. A Python job started by another thread between that check and the key's setting may still
    start PySpark's daemon (on 4, one of each then runs). Spark Connect sessions (this process has no handle on
    the server's JVM), ``local-cluster`` and cluster masters (their executors' JVMs copied the conf when they
    started) are left as they are. Set the key yourself (``pyspark.daemon`` is PySpark's) to choose.
    """
    if spark is None or session.is_connect(spark) or not session.is_local_master(spark):
        return False
    sc = spark.sparkContext
    if sc.applicationId in _decided_for:
        return False
    _decided_for.add(sc.applicationId)
    try:
        conf = session.conf_snapshot(spark)
        # The JVM's children first: a few py4j calls, where conf_default's probe starts a Python.
        if (jvm.python_workers_started(sc)
                or conf_default(conf, sc.pythonExec, WorkersStart.of_context(sc, conf)) is None):
            return False
        session.set_context_conf(spark, KEY, MODULE)
    except Exception as exc:  # a choice of speed only: never a reason to fail the run
        log.debug("spark_dist: kept this session's Python daemon (%s: %s)", type(exc).__name__, exc)
        return False
    log.info("spark_dist: this session's Python daemon now imports the installed PySpark, not Spark's zip of it "
             "(%s=%s); set %s at the session's start to choose another", KEY, MODULE, KEY)
    return True
