"""PySpark's Python daemon, importing PySpark from its installed package rather than from Spark's zip.

    SparkSession.builder.config("spark.python.daemon.module", "spark_dist_daemon")

Opt-in: set it in your own session's conf, at the session's start, where the executors' Python is this
environment's (it must find this module); ``spark-dist run`` and the demo name it in the local sessions they
create themselves. docs/speedups.md has what it saves.

Spark starts each executor's Python daemon (which forks the Python workers) with ``$SPARK_HOME/python/lib/
pyspark.zip`` and py4j's zip first on ``PYTHONPATH``. Python keeps no bytecode for modules it imports from a zip,
so every daemon compiles PySpark from source before its first task; in a fresh session that wait lies on the
first Python job's path, a training run's included.

Where the zips are the installed package's own copies (a pip-installed PySpark: ``SPARK_HOME`` is the package's
folder and the zips lie inside it; py4j's zip of the installed py4j's version), this daemon drops them from its
path and imports the package instead: the same files, from the same build. Anywhere else (a Spark distribution's
``SPARK_HOME``, another py4j) it leaves the path as Spark set it. Then it runs PySpark's own daemon, unchanged.

A module of its own, outside the ``spark_dist`` package: ``python -m spark_dist.<module>`` would import
spark_dist (and numpy) into the daemon, and so into every Python worker of the session, before anything else.
"""
import os
import re
import sys
from typing import List, Optional, Sequence

_PY4J_ZIP = re.compile(r"py4j-(?P<version>[0-9][0-9.]*)-src\.zip")


def zips_of_installed_packages(path: Sequence[str]) -> List[str]:
    """The entries of ``path`` (a ``sys.path``) that are Spark's zips of the installed PySpark's own files.

    ``pyspark.zip`` counts where it lies in ``python/lib`` of the ``pyspark`` package that ``path`` finds without
    the zips; a ``py4j-<version>-src.zip`` next to it where the installed py4j is that version. Nothing is
    imported to decide. Returns ``[]`` where none qualifies.
    """
    zips = [p for p in path if os.path.basename(p) == "pyspark.zip" or _PY4J_ZIP.fullmatch(os.path.basename(p))]
    if not zips:
        return []
    others = [p for p in path if p not in zips]
    package = _package_dir("pyspark", others)
    if package is None:
        return []
    lib = os.path.join(package, "python", "lib")
    drop = [z for z in zips if os.path.basename(z) == "pyspark.zip" and _same_dir(os.path.dirname(z), lib)]
    if not drop:
        return []  # SPARK_HOME is not the installed package: its PySpark may be another version
    py4j = _package_dir("py4j", others)
    installed = _py4j_version(py4j) if py4j else None
    for z in zips:
        match = _PY4J_ZIP.fullmatch(os.path.basename(z))
        if match and _same_dir(os.path.dirname(z), lib) and match.group("version") == installed:
            drop.append(z)
    return drop


def _package_dir(name: str, path: Sequence[str]) -> Optional[str]:
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(name, list(path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _py4j_version(package: str) -> Optional[str]:
    try:
        with open(os.path.join(package, "version.py"), encoding="utf-8") as f:
            match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def main() -> None:
    """Drop the zips (where they qualify) from this process's path, then run PySpark's daemon. Any surprise
    while deciding leaves the path as Spark set it: this must never stop a session's Python from starting."""
    try:
        drop = zips_of_installed_packages(sys.path)
    except Exception:  # noqa: BLE001 -- PySpark's zips are as good as the package, only slower
        drop = []
    if drop:
        sys.path[:] = [p for p in sys.path if p not in drop]
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
