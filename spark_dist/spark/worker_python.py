"""Whether the Python that a local master's executors start can run spark_dist, asked before any job.

On ``local``, ``local[...]`` and ``local-cluster[...]`` every Python worker runs on this machine, started as
``spark.pyspark.python``, else the ``PYSPARK_PYTHON`` the session started with, else PySpark's default
``python3``: the first on ``PATH``, which, with a virtual environment not activated, is not the interpreter
this program runs in. A run on it would fail only once its first job's task starts (``No module named
'spark_dist'``), after Spark has logged the task's failure at length; the question costs one interpreter start,
asked once per process and interpreter.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, Optional, Set, Tuple

from ..errors import ConfigError
from .python_daemon import WorkersStart

NEEDED = ("spark_dist", "torch")
_fine: Set[Tuple[str, str, str]] = set()  # (python, PYTHONPATH, cwd) already found able to run spark_dist


def problem(workers_python: str, start: WorkersStart) -> Optional[str]:
    """Why ``workers_python`` (a path, or a name looked up on ``start.path``, as Spark does), started as
    ``start`` says, cannot run spark_dist's tasks; ``None`` when it can: it finds every module of
    :data:`NEEDED` and is this interpreter's Python version (PySpark refuses another)."""
    found = workers_python if os.sep in workers_python else shutil.which(workers_python, path=start.path)
    if not found or not os.access(found, os.X_OK):
        return f"{workers_python!r} is not an interpreter found on this machine's PATH"
    probe = ("import importlib.util, sys; print('%d.%d' % sys.version_info[:2]); "
             f"print(' '.join(m for m in {NEEDED!r} if importlib.util.find_spec(m) is None))")
    env = dict(os.environ, PYTHONPATH=start.pythonpath)
    try:
        done = subprocess.run([found, "-c", probe], cwd=start.cwd or None, env=env, timeout=60, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{found} could not be started ({exc})"
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return f"{found} could not be started (exit code {done.returncode})"
    version, missing = lines
    ours = "%d.%d" % sys.version_info[:2]
    if version != ours:
        return f"{found} is Python {version}, this driver Python {ours}"
    if missing:
        return f"{found} cannot import {', '.join(missing.split())}"
    return None


def check(spark, conf: Dict[str, str]) -> None:
    """On a classic session with a local master, check that its Python workers can run spark_dist; elsewhere
    (a cluster, Spark Connect) the executors' machines are not this one, and their first task says. ``conf``:
    the session's conf as the run read it (:func:`spark_dist.spark.session.conf_snapshot`).

    Raises:
        ConfigError: they cannot, naming the interpreter, what it lacks, and the setting to change.
    """
    from . import session

    master = session.master(spark)
    if session.is_connect(spark) or not master.startswith("local"):
        return
    workers_python = conf.get("spark.pyspark.python") or spark.sparkContext.pythonExec
    start = WorkersStart.of_this_process(conf)
    key = (workers_python, start.pythonpath, start.cwd)
    if key in _fine:
        return
    why = problem(workers_python, start)
    if why is None:
        _fine.add(key)
        return
    raise ConfigError(
        f"the Python workers of this Spark session ({master}) run {workers_python!r}, and {why}. Spark starts "
        f"them with spark.pyspark.python, else the PYSPARK_PYTHON the session started with (default: the first "
        f"python3 on PATH), not with this interpreter ({sys.executable}). Set PYSPARK_PYTHON={sys.executable} "
        f"before the SparkSession starts (or activate its environment), then start the session again")
