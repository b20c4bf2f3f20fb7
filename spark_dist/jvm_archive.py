"""A class-data-sharing (CDS) archive of Spark's driver JVM: local sessions start and run their first jobs faster.

A fresh JVM reads, parses and verifies every one of Spark's classes from its jars the first time it is used:
a session that writes Parquet, assembles ML features and runs a barrier job loads about 20,000 of them, on the
same cores that then import torch in the ranks. A dynamic CDS archive (JDK 13 and newer) dumped at the exit of
one run of such a job holds those classes already parsed and verified; a JVM started with
``-XX:SharedArchiveFile`` maps them instead (about 15,000 of the 17,000 classes of the digits Pipeline's first
fit; the rest are made at run time or come from signed jars). On this project's 2-core machine that first fit of
a fresh session went from 11.2 to 10.1 s, and the whole process, session start included, from 36 to 30 s
(medians of 4 alternating pairs; BENCHMARKS.md). Peak speed is unchanged: the JIT is not involved.

    spark-dist jvm-archive            # build it once (about a minute), print the spark-defaults line

    from spark_dist import jvm_archive
    builder.config("spark.driver.extraJavaOptions", jvm_archive.driver_java_options())

An archive is only valid for the Java and the Spark jars it was dumped with, so each pair gets its own file,
named by a digest of both, under ``$SPARK_DIST_CACHE/jvm`` (default ``~/.cache/spark_dist/jvm``). A JVM whose
class path was extended after the dump (``spark.jars``, ``spark.driver.extraClassPath``) prints a
``[warning][cds]`` line and runs without the archive. It applies to a JVM started on this machine with the
option: the driver (and with it a local master's executors), not executors that a cluster starts elsewhere.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Optional

from .errors import ConfigError

_MIN_JAVA = 13  # -XX:ArchiveClassesAtExit (dynamic archives) came with JDK 13
_BUILD_TIMEOUT_S = 600


def cache_dir() -> str:
    """Where archives live: ``$SPARK_DIST_CACHE/jvm``, default ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/spark_dist/jvm`` (beside the Horovod wheels that ``scripts/build_horovod.sh`` caches)."""
    base = os.environ.get("SPARK_DIST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "spark_dist")
    return os.path.join(base, "jvm")


def java_binary() -> str:
    """The java that PySpark starts (Spark's ``spark-class``: ``$JAVA_HOME/bin/java``, else ``java`` on PATH).

    Raises:
        ConfigError: there is none (the message names ``JAVA_HOME`` or ``PATH``).
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise ConfigError(f"JAVA_HOME={java_home} has no bin/java: point JAVA_HOME at a Java installation")
        return java
    java = shutil.which("java")
    if java is None:
        raise ConfigError("no java on PATH and JAVA_HOME is not set: install Java 17 or set JAVA_HOME")
    return java


def _spark_jars() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.path.join(_find_spark_home(), "jars")


def archive_path(directory: Optional[str] = None) -> str:
    """The archive's file for this Java and these Spark jars (it may not exist yet): a digest of the java
    binary's real path, size and time, and of every jar's name, size and time, so that an upgrade of either
    gets a new file rather than an archive the JVM would refuse. Costs a ``stat`` per jar, no process.

    Raises:
        ConfigError: no java (see :func:`java_binary`).
    """
    digest = hashlib.sha256()
    java = os.path.realpath(java_binary())
    for path in [java] + sorted(os.path.join(_spark_jars(), n) for n in os.listdir(_spark_jars())):
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return os.path.join(directory or cache_dir(), f"spark-{digest.hexdigest()[:16]}.jsa")


def java_options(directory: Optional[str] = None) -> str:
    """``-XX:SharedArchiveFile=<archive>`` where this Java's and Spark's archive has been built, else ``""``
    (a JVM named a missing archive would also give up the JDK's own default archive)."""
    try:
        path = archive_path(directory)
    except (ConfigError, OSError):
        return ""
    return f"-XX:SharedArchiveFile={path}" if os.path.isfile(path) else ""


def driver_java_options(existing: str = "", directory: Optional[str] = None) -> str:
    """The value for ``spark.driver.extraJavaOptions``: ``existing`` (your own options, such as the log4j2
    file) followed by :func:`java_options`. Set it before the session's JVM starts (in the builder, in
    spark-defaults or ``spark-submit --conf``): a running JVM keeps the options it started with."""
    return " ".join(part for part in (existing.strip(), java_options(directory)) if part)


def java_major_version(java: str) -> int:
    """The feature version of ``java`` (8 for ``1.8.0_392``, 17 for ``17.0.15``).

    Raises:
        ConfigError: it does not run or prints no version.
    """
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{java} -version failed ({exc}): check JAVA_HOME or the java on PATH") from exc
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if out.returncode != 0 or found is None:
        raise ConfigError(f"{java} -version printed no version (exit {out.returncode}): check JAVA_HOME or the "
                          f"java on PATH")
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def build_archive(directory: Optional[str] = None, *, rebuild: bool = False,
                  timeout: float = _BUILD_TIMEOUT_S) -> str:
    """Build the archive for this Java and these Spark jars, unless it exists (or ``rebuild``); return its path.

    The archive is dumped at the exit of a separate process that runs a small spark_dist job on ``local[2]``
    (a Parquet write, a pandas-made DataFrame through ``VectorAssembler`` and :class:`~spark_dist.ml.TorchEstimator`
    with 2 ranks, its transform, a shuffle): the classes such jobs load. It is written beside its final name and
    renamed once complete, so a JVM never maps half an archive and a failed build leaves nothing.

    Raises:
        ConfigError: no java, or one older than 13 (the message names ``JAVA_HOME``).
        RuntimeError: the job failed, or ran past ``timeout`` seconds (then its processes are ended); the
            message holds the end of its output.
    """
    path = archive_path(directory)
    if os.path.isfile(path) and not rebuild:
        return path
    java = java_binary()
    major = java_major_version(java)
    if major < _MIN_JAVA:
        raise ConfigError(f"a JVM class archive needs Java {_MIN_JAVA} or newer; {java} is Java {major}: set "
                          f"JAVA_HOME to a newer Java (Spark 4 needs 17)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".partial",
                                   dir=os.path.dirname(path))
    os.close(fd)
    os.unlink(partial)  # the JVM creates it at exit
    # Loopback unless told otherwise, and Python workers of this interpreter (the one with torch).
    env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    # A process group of its own: on a timeout the job's JVM and Python workers go with it.
    job = subprocess.Popen([sys.executable, "-m", "spark_dist.jvm_archive", partial], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=timeout)
        if job.returncode != 0 or not os.path.isfile(partial) or os.path.getsize(partial) == 0:
            raise RuntimeError(f"building the JVM class archive failed (exit {job.returncode}): "
                               f"{_tail(output)}")
        os.replace(partial, path)
        return path
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise RuntimeError(f"building the JVM class archive ran past {timeout:g} s and was stopped") from None
    finally:
        if job.poll() is None:  # interrupted: end the group rather than leave a JVM behind
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if os.path.exists(partial):
            os.unlink(partial)


def _tail(output: str, lines: int = 30) -> str:
    # The dump's own [warning][cds] lines (classes CDS cannot hold) say nothing about why a build failed.
    kept = [line for line in (output or "").splitlines() if "[cds" not in line]
    return "\n".join(kept[-lines:]) or "(no output)"


def _run_workload(dump_to: str) -> None:
    """The archive's job (run as ``python -m spark_dist.jvm_archive FILE``): its JVM dumps the classes it
    loaded to ``FILE`` when it exits, so this waits for that exit after the session stops."""
    import tempfile as _tempfile
    import warnings

    import pandas as pd
    from pyspark import SparkContext
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import SparkSession
    from torch import nn

    from .ml import TorchEstimator

    warnings.filterwarnings("ignore", category=FutureWarning)
    spark = (SparkSession.builder.master("local[2]").appName("spark_dist jvm archive")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={dump_to}")
             .getOrCreate())
    try:
        with _tempfile.TemporaryDirectory(prefix="spark_dist-jvm-archive-") as scratch:
            spark.range(1000).selectExpr("id", "id % 10 AS label").write.parquet(os.path.join(scratch, "p"))
            spark.read.parquet(os.path.join(scratch, "p")).groupBy("label").count().collect()
            names = [f"x{i}" for i in range(8)]
            rows = pd.DataFrame({n: [float((i * (j + 3)) % 7) for i in range(256)] for j, n in enumerate(names)})
            rows["label"] = [i % 3 for i in range(256)]
            df = spark.createDataFrame(rows)
            estimator = TorchEstimator(model=nn.Linear(8, 3), featuresCol="features", labelCol="label",
                                       epochs=1, batchSize=64, numProcesses=2, backend="ddp")
            fitted = Pipeline(stages=[VectorAssembler(inputCols=names, outputCol="features"), estimator]).fit(df)
            fitted.transform(df).select("prediction").collect()
    finally:
        spark.stop()
    # The JVM exits when its stdin closes (PySpark's gateway watches it), and dumps the archive on the way out.
    gateway = SparkContext._gateway
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait()


if __name__ == "__main__":
    _run_workload(sys.argv[1])
