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

import importlib.util
import logging
import os
import shutil
import sys
from typing import Dict, Optional

from . import jvm, session

log = logging.getLogger(__name__)

KEY = "spark.python.daemon.module"
MODULE = "spark_dist_daemon"

_decided_for: set = set()  # applicationIds: the choice is made once per SparkContext


def runs_this_environment(workers_python: str) -> bool:
    """Whether ``workers_python`` (a path, or a name looked up on ``PATH`` as Spark does: PySpark's default is
    ``python3``) is this interpreter, in this environment's folder, and this interpreter finds spark_dist_daemon.

    The folder is compared as given, not resolved: two virtual environments' pythons link to one interpreter.
    An editable install made before the module existed does not find it.
    """
    found = workers_python if os.sep in workers_python else shutil.which(workers_python)
    if not found:
        return False
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(found)
    return (os.path.dirname(there) == os.path.dirname(here)
            and os.path.realpath(there) == os.path.realpath(here)
            and importlib.util.find_spec(MODULE) is not None)


def conf_default(conf: Dict[str, str], workers_python: str) -> Optional[str]:
    """The daemon module for a session with ``conf`` whose local workers run ``workers_python``: :data:`MODULE`
    on a local master (``local``, ``local[...]``, ``local-cluster[...]``: every executor runs on this machine)
    where :func:`runs_this_environment`, unless ``conf`` names a daemon or runs none
    (``spark.python.use.daemon=false``); else ``None``."""
    if (KEY in conf or not conf.get("spark.master", "").startswith("local")
            or conf.get("spark.python.use.daemon", "true").strip().lower() == "false"):
        return None
    return MODULE if runs_this_environment(workers_python) else None


def use_in_session(spark) -> bool:
    """Have ``spark``'s Python daemon import the installed PySpark from now on, where that is safe; once per
    SparkContext. Returns whether it set :data:`KEY`.

    It does on a classic session with a local master (the executors share the driver's JVM, and so its conf)
    whose Python workers run this environment (``PYSPARK_PYTHON``, else ``python3`` on ``PATH``), where neither
    :data:`KEY` nor ``spark.python.use.daemon=false`` is set, and no Python daemon or worker has started yet: a
    running daemon keeps serving its workers on Spark 3.5 (it reads the key once), and on 4 a second one would
    start beside it. Spark Connect sessions and cluster masters are left as they are. Set the key yourself
    (``pyspark.daemon`` is PySpark's) to choose.
    """
    if spark is None or session.is_connect(spark) or not session.is_local_master(spark):
        return False
    sc = spark.sparkContext
    if sc.applicationId in _decided_for:
        return False
    _decided_for.add(sc.applicationId)
    if conf_default(session.conf_snapshot(spark), sc.pythonExec) is None or jvm.python_workers_started(sc):
        return False
    jvm.set_context_conf(sc, KEY, MODULE)
    log.info("spark_dist: this session's Python daemon now imports the installed PySpark, not Spark's zip of it "
             "(%s=%s); set %s at the session's start to choose another", KEY, MODULE, KEY)
    return True
