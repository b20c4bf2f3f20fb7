"""The check, before any job, that a local master's Python workers can run spark_dist (no Spark here: the
interpreters are this one and stand-ins made for the test). A session refusing a run with it is in
tests/spark/test_launcher.py."""
import os
import sys

from spark_dist.spark.python_daemon import WorkersStart
from spark_dist.spark.worker_python import problem


def start(tmp_path):
    return WorkersStart(os.environ.get("PATH", ""), "", str(tmp_path))


def interpreter(tmp_path, name, flags):
    """An executable script that runs this Python's base interpreter with ``flags`` (``-S``: without any
    environment's site-packages, as a system python3 outside the virtual environment)."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\nexec {sys._base_executable} {flags} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_this_interpreter_can_run_spark_dist(tmp_path):
    assert problem(sys.executable, start(tmp_path)) is None


def test_a_python_without_this_environment_names_what_it_cannot_import(tmp_path):
    bare = interpreter(tmp_path, "python3", "-S")
    assert problem(bare, start(tmp_path)) == f"{bare} cannot import spark_dist, torch"
    # Found by name on PATH, as Spark's default "python3" is.
    path = WorkersStart(f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}", "", str(tmp_path))
    assert problem("python3", path) == f"{bare} cannot import spark_dist, torch"


def test_a_name_on_no_path_and_an_interpreter_that_does_not_start_are_named(tmp_path):
    assert problem("python-nowhere", start(tmp_path)) == "'python-nowhere' is not an interpreter found on " \
                                                          "this machine's PATH"
    broken = interpreter(tmp_path, "broken", "--no-such-flag")
    assert problem(broken, start(tmp_path)).startswith(f"{broken} could not be started (exit code ")
