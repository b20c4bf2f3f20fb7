"""Which daemon forks a local session's Python workers: :mod:`spark_dist_daemon` where it can serve them, PySpark's
own elsewhere.

``spark_dist_daemon`` is PySpark's daemon, run after dropping Spark's zips of the installed PySpark from its path
(its docstring says why: the zip is compiled afresh on the first Python job of every session). Spark reads
``spark.python.daemon.module`` when it starts a daemon. Only sessions spark_dist creates itself (``spark-dist
run``, the demo) name it by default (:func:`conf_default`); a session you build yourself keeps PySpark's daemon
unless you set the key (docs/speedups.md): spark_dist never changes a running session's conf.

The default applies only where the workers run this environment's interpreter, which finds the module: a Python
that could not import it would start no Python task of the session at all.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, NamedTuple, Optional

KEY = "spark.python.daemon.module"
MODULE = "spark_dist_daemon"


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

