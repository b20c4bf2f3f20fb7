"""A class-data-sharing (CDS) archive of Spark's driver JVM: local sessions start and run their first jobs faster.

A fresh JVM reads, parses and verifies every one of Spark's classes from its jars the first time it is used:
about 17,000 for a session's first ML fit (a Parquet write, ``VectorAssembler``, a barrier job), on the same
cores that then import torch in the ranks. A dynamic CDS archive (JDK 13 and newer) dumped at the exit of one run
of such a job holds them already parsed and verified; a JVM started with ``-XX:SharedArchiveFile`` maps them
instead: about 15,000 of those 17,000 (the rest are made at run time, or come from signed jars, which CDS skips).
On this project's 2-core machine, Spark 4 line, the digits Pipeline's first fit in a fresh session went from 11.2
to 10.1 s, and the whole process, session start included, from 36 to 30 s (medians of 4 alternating pairs); on the
3.5 line only the session's start gained, about 3 s (BENCHMARKS.md). Peak speed is unchanged: the JIT is not
involved.

    spark-dist jvm-archive            # build it once (about a minute), print the option;
                                      # `spark-dist run` uses it by itself from then on

    from spark_dist.cli import jvm_archive
    builder.config("spark.driver.extraJavaOptions", jvm_archive.driver_java_options())

What a JVM checks before it maps an archive, and how this module keeps to it:

- the same Java and the same class path as at the dump: each Java installation, set of Spark jars and class-path
  setting (``SPARK_CONF_DIR``, ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR``, ``SPARK_DIST_CLASSPATH``) gets its own
  file, named by a digest of them, under ``$SPARK_DIST_CACHE/jvm`` (default ``~/.cache/spark_dist/jvm``; about
  190 MB each; a new build deletes the one this machine built for the same paths before a JDK or pyspark
  update). A JVM whose class path grew in front (``spark.driver.extraClassPath``) prints a
  ``[warning][cds]`` line and runs without it.
- no non-empty directory in front of the jars: Spark puts its conf directory (``SPARK_CONF_DIR``, default
  ``$SPARK_HOME/conf``) first, so an archive is only possible where that directory is empty or absent, as in a
  pip-installed PySpark. Pass settings with ``--properties-file`` or the session builder instead; where the
  directory holds files, :func:`java_options` gives nothing and :func:`build_archive` says why.
- the file exists on the machine that starts the JVM: the option serves the driver (and with it a local master's
  executors) in client mode, not a driver or executors that a cluster starts on other hosts.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from ..host import tempdirs
from ..errors import ConfigError

logger = logging.getLogger(__name__)

_MIN_JAVA = 13  # -XX:ArchiveClassesAtExit (dynamic archives) came with JDK 13
_BUILD_TIMEOUT_S = 600
_STALE_PARTIAL_S = 3600  # a partial file this old belongs to no running build
_HOST_SUFFIX = ".host"  # beside each archive: the name of the machine that built it
_SCRATCH_KIND = "jvm-archive"  # the build job's temp dir: a tempdirs directory of this kind, named after the caller
# What decides the driver's class path besides the jars and the conf directory (Spark's launcher,
# AbstractCommandBuilder.buildClassPath).
_CLASS_PATH_VARIABLES = ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH")
# Set by a process that runs under spark-submit, pyspark or Connect: the build's job must start a JVM of its own.
_INHERITED_SESSION_VARIABLES = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS",
                                "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")


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


_java_homes: Dict[str, str] = {}


def _java_files(java: str) -> List[str]:
    """The files whose change invalidates an archive: the java binary, and its installation's JVM library, base
    archive and release file. The installation is the binary's real path two levels up; where that is no JDK
    (a jenv or asdf shim, which stays the same file when the JDK behind it changes) java is asked for its
    ``java.home`` (once per process)."""
    real = os.path.realpath(java)
    home = os.path.dirname(os.path.dirname(real))
    if not glob.glob(os.path.join(home, "lib", "server", "libjvm.*")):  # .so, or .dylib on macOS
        if real not in _java_homes:
            out = _run_java(real, "-XshowSettings:properties", "-version")
            found = re.search(r"^\s*java\.home = (.+)$", out, re.M)
            _java_homes[real] = found.group(1).strip() if found else home
        home = _java_homes[real]
    names = [os.path.join(home, "bin", "java"), os.path.join(home, "release")] + \
        glob.glob(os.path.join(home, "lib", "server", "*"))
    return [real] + sorted(n for n in names if os.path.isfile(n))


def _run_java(java: str, *args: str) -> str:
    try:
        out = subprocess.run([java, *args], capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{java} {' '.join(args)} failed ({exc}): check JAVA_HOME or the java on PATH") from exc
    return out.stderr + out.stdout


def spark_jars() -> str:
    """The jars directory of the Spark that PySpark launches (``SPARK_HOME``, else the pip package's).

    Raises:
        ConfigError: there is none (the message names ``SPARK_HOME``).
    """
    try:
        from pyspark.find_spark_home import _find_spark_home

        home = _find_spark_home()
    except (ImportError, SystemExit) as exc:  # _find_spark_home exits when it finds nothing
        raise ConfigError(f"no Spark installation found ({exc}): install pyspark or set SPARK_HOME") from None
    jars = os.path.join(home, "jars")
    if not os.path.isdir(jars):
        raise ConfigError(f"SPARK_HOME={home} has no jars/ directory (a source tree?): point SPARK_HOME at a Spark "
                          f"distribution or an installed pyspark")
    return jars


def _conf_dir() -> str:
    """Spark's conf directory as its launcher puts it on the class path (``SPARK_CONF_DIR``, by default
    ``$SPARK_HOME/conf``, which spark-submit's scripts also export under that name), resolved."""
    return os.path.realpath(os.environ.get("SPARK_CONF_DIR") or os.path.join(os.path.dirname(spark_jars()), "conf"))


def conf_dir_in_the_way() -> Optional[str]:
    """Spark's conf directory where it holds files (then no archive can serve this Spark), else ``None``.

    HotSpot maps no archive whose class path has a non-empty directory in front of the classes it holds, and
    Spark's launcher puts the conf directory in front of the jars."""
    conf = _conf_dir()
    try:
        return conf if os.path.isdir(conf) and os.listdir(conf) else None
    except OSError:
        return None


def archive_path(directory: Optional[str] = None) -> str:
    """The archive's file for this Java, these Spark jars and this class-path setting (it may not exist yet).

    Named ``spark-<place>-<files>.jsa``. ``place`` is a digest of where the inputs are: the Java installation's
    files (by path: one JDK behind a ``java`` that update-alternatives switches is not another's), the jars
    directory, ``SPARK_CONF_DIR``, ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR`` and
    ``SPARK_DIST_CLASSPATH``. ``files`` is a digest of what they hold: the Java installation's files and every
    jar, by path, size and time. A change of any gets a new file rather than an archive the JVM would refuse; a
    change of the files alone (a JDK or pyspark updated in place) leaves the place the same, which is how
    :func:`build_archive` knows which older archive the new one replaces. Costs a ``stat`` per jar.

    Raises:
        ConfigError: no java (see :func:`java_binary`) or no Spark (see :func:`spark_jars`).
    """
    java_files, jars = _java_files(java_binary()), spark_jars()
    place = hashlib.sha256(f"jars={jars}\0".encode())
    for path in java_files:
        place.update(f"java={path}\0".encode())
    # The conf directory resolved: set or defaulted, it is the same path on the class path.
    place.update(f"SPARK_CONF_DIR={_conf_dir()}\n".encode())
    for name in _CLASS_PATH_VARIABLES:
        place.update(f"{name}={os.environ.get(name, '')}\n".encode())
    files = hashlib.sha256()
    for path in java_files + sorted(os.path.join(jars, n) for n in os.listdir(jars)):
        st = os.stat(path)
        files.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    name = f"spark-{place.hexdigest()[:16]}-{files.hexdigest()[:16]}.jsa"
    return os.path.join(os.path.abspath(directory or cache_dir()), name)


def _place_of(archive: str) -> str:
    """The place part of an archive's name (``spark-<place>-<files>.jsa``, :func:`archive_path`)."""
    return os.path.basename(archive).split("-")[1]


def _built_on(archive: str) -> Optional[str]:
    """The name of the machine that built ``archive`` (its ``.host`` file beside it), or ``None``."""
    try:
        with open(archive + _HOST_SUFFIX) as f:
            return f.read().strip()
    except OSError:
        return None


def _remove_replaced(path: str, started: float) -> List[str]:
    """Delete the archives that ``path``, whose build began at ``started`` (``time.time()``), replaces: those of
    the same place (:func:`archive_path`) that this machine built and finished before that, for files that have
    changed since, which no JVM started from that place can map any more.

    Those of other Java or Spark installations or class-path settings stay. So does one that another build
    finished meanwhile (maybe for files newer than the ones this build began with), and one built on another
    machine: in a cache directory shared by several (an NFS home), the same paths may hold other files there, and
    a JVM there may have it mapped (deleting a file mapped on another NFS client can crash that JVM; on this
    machine a running JVM keeps its mapping). Returns the paths deleted; best effort (one that cannot be deleted
    is left, with a warning)."""
    place = _place_of(path)
    here = socket.gethostname()
    removed = []
    for old in glob.glob(os.path.join(glob.escape(os.path.dirname(path)), f"spark-{place}-*.jsa")):
        try:
            if old == path or os.path.getmtime(old) >= started or _built_on(old) != here:
                continue
            os.unlink(old)
        except OSError as exc:
            logger.warning("spark_dist: could not delete the replaced JVM class archive %s: %s", old, exc)
            continue
        removed.append(old)
        try:
            os.unlink(old + _HOST_SUFFIX)
        except OSError as exc:
            logger.warning("spark_dist: deleted the replaced JVM class archive %s, but not its %s file: %s", old,
                           _HOST_SUFFIX, exc)
    return removed


def java_options(directory: Optional[str] = None) -> str:
    """``-XX:SharedArchiveFile=<archive>`` where this Java's and Spark's archive has been built and can serve,
    else ``""``: a JVM named a missing archive would also give up the JDK's own default archive. Quoted where
    the path has spaces (Spark splits Java options on spaces outside quotes). Never raises."""
    if not glob.glob(os.path.join(glob.escape(os.path.abspath(directory or cache_dir())), "*.jsa")):
        return ""  # none built: no need to look at the jars (spark-dist run asks on every start)
    try:
        path = archive_path(directory)
        usable = os.path.isfile(path) and conf_dir_in_the_way() is None
    except (ConfigError, OSError, ValueError):
        return ""
    return archive_option(path) if usable else ""


def archive_option(path: str) -> str:
    """The JVM option that maps the archive at ``path`` (as :func:`build_archive` returns it)."""
    return _java_option("SharedArchiveFile", path)


def _java_option(name: str, path: str, prefix: str = "-XX:") -> str:
    """``-XX:name=path`` (or another ``prefix``), quoted where the path has white space: Spark splits Java
    options on it."""
    return f'{prefix}{name}="{path}"' if re.search(r"\s", path) else f"{prefix}{name}={path}"


def decides_class_sharing(options: str) -> bool:
    """Whether Java options choose class sharing themselves (an archive of their own, ``-Xshare:off``, ...)."""
    return re.search(r"-XX:(SharedArchiveFile|ArchiveClassesAtExit)=|-Xshare:|-XX:[+-]UseSharedSpaces",
                     options) is not None


def driver_java_options(existing: str = "", directory: Optional[str] = None, *, default_options: str = "") -> str:
    """The value for ``spark.driver.extraJavaOptions``: ``existing`` (your own options, such as the log4j2
    file) followed by :func:`java_options`; ``existing`` alone where it, or ``default_options`` (the session's
    ``spark.driver.defaultJavaOptions``, which Spark puts before it), already decides class sharing itself (an
    archive of its own, ``-Xshare:off``): the archive's option would override your choice, or be ignored. Set
    it before the session's JVM starts (in the builder, a ``--properties-file`` or ``spark-submit --conf``): a
    running JVM keeps the options it started with."""
    if decides_class_sharing(existing) or decides_class_sharing(default_options):
        return existing.strip()
    return " ".join(part for part in (existing.strip(), java_options(directory)) if part)


def java_major_version(java: str) -> int:
    """The feature version of ``java`` (8 for ``1.8.0_392``, 17 for ``17.0.15``).

    Raises:
        ConfigError: it does not run or prints no version.
    """
    found = re.search(r'version "(\d+)(?:\.(\d+))?', _run_java(java, "-version"))
    if found is None:
        raise ConfigError(f"{java} -version printed no version: check JAVA_HOME or the java on PATH")
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def build_archive(directory: Optional[str] = None, *, rebuild: bool = False,
                  timeout: float = _BUILD_TIMEOUT_S) -> str:
    """Build the archive for this Java and these Spark jars, unless it exists (or ``rebuild``); return its path.

    The archive is dumped at the exit of a separate process that runs a small spark_dist job on ``local[2]``
    (a Parquet write and read with a shuffle; a pandas-made DataFrame through ``VectorAssembler`` and
    :class:`~spark_dist.ml.TorchEstimator` with 2 ranks; its transform): the classes such jobs load. It is
    written beside its final name and renamed once complete, so that no JVM maps half an archive. Whatever else
    the job writes (Spark's local directories, the JVM's and Python's temp files, its Parquet files) goes to a
    temp directory of its own, removed however the job ends; so a failed or stopped build leaves nothing, and
    the job ends itself, removing it, if this process dies. Once built, it deletes the archive it
    replaces: the one this machine built for the same Java, Spark and class-path setting before their files
    changed (a ``.host`` file beside each archive names the machine that built it).

    Raises:
        ConfigError: no java, one older than 13 (the message names ``JAVA_HOME``), no Spark, Spark's conf
            directory holds files (names ``SPARK_CONF_DIR``; see the module's notes), or ``directory`` cannot
            be written.
        RuntimeError: the job failed, or ran past ``timeout`` seconds (then its processes are ended); the
            message holds the end of its output.
    """
    started = time.time()
    path = archive_path(directory)
    conf = conf_dir_in_the_way()  # first: an archive already built cannot serve either
    if conf is not None:
        raise ConfigError(f"Spark's conf directory {conf} holds files, and a JVM maps no class archive with a "
                          f"non-empty directory in front of Spark's jars: point SPARK_CONF_DIR at an empty "
                          f"directory and pass its settings with --properties-file or the session builder")
    if os.path.isfile(path) and not rebuild:
        return path
    java = java_binary()
    major = java_major_version(java)
    if major < _MIN_JAVA:
        raise ConfigError(f"a JVM class archive needs Java {_MIN_JAVA} or newer; {java} is Java {major}: set "
                          f"JAVA_HOME to a newer Java (Spark 4 needs 17)")
    partial = _new_partial(path)
    # Loopback unless told otherwise, Python workers of this interpreter (the one with torch), and a JVM of the
    # job's own even where this process runs under spark-submit, pyspark or Connect.
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_SESSION_VARIABLES}
    env.update(SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    # The job's temp directory: a killed JVM leaves its local directories and native libraries behind.
    scratch = tempdirs.make(_SCRATCH_KIND)  # also removes those of builds whose process died with their job
    env.pop("SPARK_LOCAL_DIRS", None)  # it would take Spark's local directories elsewhere
    env["TMPDIR"] = scratch
    # A process group of its own, so that a timeout or an interrupt ends the job's JVM with it: killed, the JVM
    # dumps nothing, where an orderly exit would write the partial file after its removal below.
    try:
        job = subprocess.Popen([sys.executable, "-m", "spark_dist.cli.jvm_archive", partial, str(os.getpid()), scratch],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        output, _ = job.communicate(timeout=timeout)
        if job.returncode != 0 or not os.path.isfile(partial) or os.path.getsize(partial) == 0:
            raise RuntimeError(f"building the JVM class archive failed (exit {job.returncode}); the job's output "
                               f"ends (to see all of it, run the job by hand: python -m spark_dist.cli.jvm_archive "
                               f"/tmp/test.jsa):\n{_tail(output)}")
        os.replace(partial, path)
        with open(path + _HOST_SUFFIX, "w") as f:
            f.write(socket.gethostname() + "\n")
        _remove_replaced(path, started)
        return path
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise RuntimeError(f"building the JVM class archive ran past {timeout:g} s and was stopped") from None
    finally:
        if job.poll() is None:  # interrupted (Ctrl-C): end the group rather than leave a JVM behind
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        if os.path.exists(partial):
            os.unlink(partial)


def _new_partial(path: str) -> str:
    """A fresh name beside ``path`` for the JVM to dump to, after removing partial files left by builds whose
    process was killed outright (older than any build runs).

    Raises:
        ConfigError: the directory cannot be made or written (names it).
    """
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        for old in glob.glob(os.path.join(directory, "*.partial")):
            if time.time() - os.path.getmtime(old) > _STALE_PARTIAL_S:
                os.unlink(old)
        fd, partial = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".partial", dir=directory)
    except OSError as exc:
        raise ConfigError(f"cannot write JVM class archives to {directory} ({exc}): pass another directory "
                          f"(--cache-dir, or SPARK_DIST_CACHE)") from exc
    os.close(fd)
    os.unlink(partial)  # the JVM creates it at exit
    return partial


def _tail(output: str, lines: int = 30) -> str:
    # The dump's warnings (one per class CDS cannot hold) say nothing about why a build failed; its errors do.
    kept = [line for line in (output or "").splitlines() if "[warning][cds" not in line]
    return "\n".join(kept[-lines:]) or "(no output)"


def _end_with_parent(parent: int, scratch: Optional[str]) -> None:
    """End this job and its JVM at once (SIGKILL to the process group: a killed JVM dumps nothing) when the
    process that started it is gone, which then cannot: killed outright, its clean-up never ran. So this
    removes the job's temp directory ``scratch`` too. Only as :func:`build_archive` starts it, leading a process
    group of its own with ``parent`` as its parent: run by hand, the group would be the shell's."""
    if os.getpgrp() != os.getpid() or os.getppid() != parent:
        sys.exit(f"spark_dist.cli.jvm_archive: started by {os.getppid()}, not by build_archive in {parent} as a "
                 f"process group of its own: run it by hand without the parent pid")

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        if scratch is not None:  # this process ends with its group: one outside it removes what the group wrote
            subprocess.Popen([sys.executable, "-c", _REMOVE_ONCE_GONE, str(os.getpgrp()), scratch],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="spark_dist-jvm-archive-parent").start()


# python -c _REMOVE_ONCE_GONE PGID DIR: remove DIR once no process of the group is left (SIGKILL takes a moment;
# zombies are not waited for), or after 30 s.
_REMOVE_ONCE_GONE = """
import os, shutil, sys, time
import psutil
group, path = int(sys.argv[1]), sys.argv[2]

def left():
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except OSError:
            pass
    return False

deadline = time.monotonic() + 30
while left() and time.monotonic() < deadline:
    time.sleep(0.1)
shutil.rmtree(path, ignore_errors=True)
"""


def _run_workload(dump_to: str, scratch: Optional[str] = None) -> int:
    """The archive's job: its JVM dumps the classes it loaded to ``dump_to`` when it exits, so this waits for
    that exit after the session stops; returns the JVM's exit code. ``scratch``: the JVM's temp directory (its
    ``java.io.tmpdir``, and so Spark's local directories), as :func:`build_archive` gives it."""
    import warnings

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    warnings.filterwarnings("ignore", category=FutureWarning)
    spark = (SparkSession.builder.master("local[2]").appName("spark_dist jvm archive")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", _java_option("ArchiveClassesAtExit", dump_to) + (
                 " " + _java_option("java.io.tmpdir", scratch, prefix="-D") if scratch else ""))
             .getOrCreate())
    try:
        import pandas as pd
        from pyspark.ml import Pipeline
        from pyspark.ml.feature import VectorAssembler
        from torch import nn

        from ..ml import TorchEstimator

        with tempfile.TemporaryDirectory(prefix="spark_dist-jvm-archive-") as scratch:
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
    return gateway.proc.wait()


if __name__ == "__main__":  # python -m spark_dist.cli.jvm_archive FILE [PARENT_PID TEMP_DIR] (build_archive's)
    _scratch = sys.argv[3] if len(sys.argv) > 3 else None
    if len(sys.argv) > 2:
        _end_with_parent(int(sys.argv[2]), _scratch)
    sys.exit(_run_workload(sys.argv[1], _scratch))
