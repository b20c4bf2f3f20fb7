"""The JVM class archive (spark_dist.cli.jvm_archive): built once per Java and Spark, used by sessions started with it.

One archive is built for the module (about a minute, by ``spark-dist jvm-archive`` into a temporary cache
directory); a session started with its option runs in a subprocess, because driver JVM options only take effect
in a JVM started with them and this test process may already hold one.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

import psutil
import pytest

from clusters import SPARK_4, _wait_for, running, still_running_after
from spark_dist.cli import jvm_archive
from spark_dist.errors import ConfigError
from commands import run_command, spark_dist


OTHER_INSTALLATIONS = f"spark-{'0' * 16}-{'0' * 16}.jsa"  # an archive of another Java, Spark or class path
OTHER_MACHINES = "spark-{place}-" + "1" * 16 + ".jsa"  # this place's, built on another machine


def _old_archive(path, host):
    """An empty file standing for an archive ``host`` built a minute ago (its name and .host are all read)."""
    for name, text in ((path, ""), (path + ".host", host + "\n")):
        with open(name, "w") as f:
            f.write(text)
        os.utime(name, (os.path.getmtime(name) - 60,) * 2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``spark-dist jvm-archive --cache-dir D``: its output line and D."""
    # A space in the path: Spark splits Java options on spaces outside quotes.
    directory = str(tmp_path_factory.mktemp("jvm-archives") / "with space")
    os.makedirs(directory)
    # Already there, each an empty file with the machine that built it (a build reads no more of them):
    # this installation's archive from before an update of its files (its place is the same, its files part is
    # not), the same place's built on another machine sharing the directory, and another installation's.
    place = jvm_archive._place_of(jvm_archive.archive_path(directory))
    for name, host in ((f"spark-{place}-{'0' * 16}.jsa", socket.gethostname()),
                       (OTHER_MACHINES.format(place=place), "another-host"),
                       (OTHER_INSTALLATIONS, socket.gethostname())):
        _old_archive(os.path.join(directory, name), host)
    result = spark_dist("jvm-archive", "--cache-dir", directory, timeout=420)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout.strip(), directory


def test_the_command_builds_it_and_prints_the_spark_defaults_line(built):
    line, directory = built
    path = jvm_archive.archive_path(directory)
    assert line == f'spark.driver.extraJavaOptions -XX:SharedArchiveFile="{path}"'
    assert os.path.getsize(path) > 10 << 20  # thousands of classes, not an empty dump
    # The partial file was renamed, and the archive it replaces deleted, with its .host file; another
    # machine's and another installation's stay.
    others = [OTHER_MACHINES.format(place=jvm_archive._place_of(path)), OTHER_INSTALLATIONS]
    assert sorted(os.listdir(directory)) == sorted(
        name + suffix for name in [os.path.basename(path), *others] for suffix in ("", ".host"))
    assert open(path + ".host").read() == socket.gethostname() + "\n"


def test_a_second_build_reuses_the_archive(built):
    _, directory = built
    path = jvm_archive.archive_path(directory)
    before = os.stat(path)
    assert jvm_archive.build_archive(directory) == path
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


SESSION = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from spark_dist.cli import jvm_archive

    directory, log, out = sys.argv[1:]
    options = jvm_archive.driver_java_options(f"-Xlog:class+load=info:file={log}", directory)
    spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.driver.extraJavaOptions", options).getOrCreate())
    spark.range(100).selectExpr("id", "id % 3 AS k").write.parquet(out)
    print(spark.read.parquet(out).groupBy("k").count().count())
    spark.stop()
""")


def test_a_session_started_with_it_loads_sparks_classes_from_the_archive(built, tmp_path):
    _, directory = built
    log = tmp_path / "classes.log"
    result = run_command([sys.executable, "-c", SESSION, directory, str(log), str(tmp_path / "out")], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "3"  # the session worked: written, read, grouped
    assert "[warning][cds" not in result.stdout + result.stderr  # the JVM accepted the archive
    # -Xlog:class+load says where each class came from; "(top)" is the dynamic archive, over the JDK's own.
    sources = dict(re.findall(r"\] (org\.apache\.spark\.\S+) source: (.+)", log.read_text()))
    assert sources["org.apache.spark.SparkContext"] == "shared objects file (top)"
    assert sources["org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"] == \
        "shared objects file (top)"
    # Of the classes a jar could give (not those made at run time: lambdas, proxies, generated code), the
    # jars gave few: the archive held the rest.
    from_jars = sum(1 for s in sources.values() if s.startswith(("file:", "jar:")))
    archived = sum(1 for s in sources.values() if s == "shared objects file (top)")
    assert archived > 10 * from_jars, (archived, from_jars)


def test_without_an_archive_no_option_is_added(tmp_path):
    assert jvm_archive.java_options(str(tmp_path)) == ""
    assert jvm_archive.driver_java_options(" -Dlog4j2.configurationFile=x ", str(tmp_path)) == \
        "-Dlog4j2.configurationFile=x"


def _fake_spark_home(root, jars):
    os.makedirs(root / "jars")
    for name in jars:
        (root / "jars" / name).write_bytes(b"PK")
    return root


def _fake_jdk(root):
    """A directory laid out as a JDK (bin/java, lib/server/libjvm.so, release): the key reads these files'
    sizes and times, and never runs them."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "server").mkdir(parents=True)
    shutil.copy(os.path.realpath(jvm_archive.java_binary()), root / "bin" / "java")
    (root / "lib" / "server" / "libjvm.so").write_bytes(b"\x7fELF one build")
    (root / "release").write_text('JAVA_VERSION="17.0.15"\n')
    return root


def test_each_java_spark_and_class_path_get_their_own_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", str(_fake_spark_home(tmp_path / "spark", ["a.jar", "b.jar"])))
    monkeypatch.setenv("JAVA_HOME", str(_fake_jdk(tmp_path / "jdk")))
    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    seen = [jvm_archive.archive_path(str(tmp_path))]
    assert jvm_archive.archive_path(str(tmp_path)) == seen[0]  # the same installation, the same file

    (tmp_path / "spark" / "jars" / "c.jar").write_bytes(b"PK")  # Spark upgraded: jars added or replaced
    seen.append(jvm_archive.archive_path(str(tmp_path)))
    # The JDK updated in place (same paths, a new JVM library), as a package manager does.
    (tmp_path / "jdk" / "lib" / "server" / "libjvm.so").write_bytes(b"\x7fELF the next build, longer")
    seen.append(jvm_archive.archive_path(str(tmp_path)))
    # Files changed at the same paths: the same place, which tells a build what its archive replaces.
    assert {jvm_archive._place_of(path) for path in seen} == {jvm_archive._place_of(seen[0])}
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path / "hadoop-conf"))  # on the class path, after the jars
    seen.append(jvm_archive.archive_path(str(tmp_path)))
    assert len(set(seen)) == len(seen), seen
    # Another class path: an archive beside the first, not after it.
    assert jvm_archive._place_of(seen[-1]) != jvm_archive._place_of(seen[0])
    # Another Spark, another Java (as update-alternatives switches /usr/bin/java): each a place of its own, whose
    # archive no build of the other deletes.
    places = {jvm_archive._place_of(seen[-1])}
    monkeypatch.setenv("SPARK_HOME", str(_fake_spark_home(tmp_path / "spark-next", ["a.jar", "b.jar"])))
    places.add(jvm_archive._place_of(jvm_archive.archive_path(str(tmp_path))))
    monkeypatch.setenv("JAVA_HOME", str(_fake_jdk(tmp_path / "jdk-next")))
    places.add(jvm_archive._place_of(jvm_archive.archive_path(str(tmp_path))))
    assert len(places) == 3, places


def test_a_build_deletes_only_the_archives_finished_before_it_began(tmp_path):
    """Two builds of one place at once (an update between their starts): the one finishing last keeps the
    other's archive, which may be built for the newer files."""
    place = "1" * 16
    older, newer, mine = (str(tmp_path / f"spark-{place}-{files * 16}.jsa") for files in "abc")
    for path in (older, newer, mine):
        _old_archive(path, socket.gethostname())
    began = os.path.getmtime(older) + 30  # older finished before this build began, newer after
    os.utime(newer, (began + 10,) * 2)
    assert jvm_archive._remove_replaced(mine, began) == [older]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) + suffix for p in (newer, mine)
                                                  for suffix in ("", ".host"))


def test_spark_conf_files_in_front_of_the_jars_rule_the_archive_out(tmp_path, monkeypatch):
    """Spark's launcher puts SPARK_CONF_DIR first on the class path, and HotSpot maps no archive behind a
    non-empty directory (a real session refused one: BENCHMARKS.md, session 13): with files there, no option,
    and the build says what to change."""
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    directory = str(tmp_path / "cache")
    os.makedirs(directory)
    # An empty file stands for this setting's archive: only its presence is read here.
    open(jvm_archive.archive_path(directory), "wb").close()
    assert jvm_archive.java_options(directory) != ""  # an empty conf directory is no obstacle
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert jvm_archive.java_options(directory) == ""
    with pytest.raises(ConfigError, match=f"conf directory {re.escape(str(conf))} holds files.*SPARK_CONF_DIR"):
        jvm_archive.build_archive(directory)


def test_the_conf_directory_counts_by_where_it_is_not_how_it_is_named(tmp_path, monkeypatch):
    """spark-submit's scripts export SPARK_CONF_DIR=$SPARK_HOME/conf: the same class path, so the same archive."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    default = jvm_archive.archive_path(str(tmp_path))
    monkeypatch.setenv("SPARK_CONF_DIR", os.path.join(os.path.dirname(jvm_archive.spark_jars()), "conf"))
    assert jvm_archive.archive_path(str(tmp_path)) == default
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "elsewhere"))
    assert jvm_archive.archive_path(str(tmp_path)) != default


def test_a_path_with_spaces_is_quoted(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    directory = tmp_path / "my archives"
    path = jvm_archive.archive_path(str(directory))
    directory.mkdir()
    open(path, "wb").close()
    assert jvm_archive.java_options(str(directory)) == f'-XX:SharedArchiveFile="{path}"'


def test_a_java_home_without_java_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=f"JAVA_HOME={re.escape(str(tmp_path))} has no bin/java"):
        jvm_archive.build_archive(str(tmp_path / "cache"))
    assert jvm_archive.java_options(str(tmp_path / "cache")) == ""  # a session still starts, without it
    assert not (tmp_path / "cache").exists()


def _java_that_prints(tmp_path, version_line):
    """A ``bin/java`` that prints another Java's ``-version`` line: only this machine's Java 17 exists here,
    and the versions it stands for (8, 11) are what the check must refuse."""
    (tmp_path / "bin").mkdir()
    java = tmp_path / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return str(java)


@pytest.mark.parametrize("line, major", [('openjdk version "1.8.0_392"', 8),
                                         ('openjdk version "11.0.21" 2023-10-17', 11),
                                         ('openjdk version "17.0.15" 2025-04-15', 17),
                                         ('java version "21" 2023-09-19', 21)])
def test_the_java_version_is_read_as_spark_reads_it(tmp_path, line, major):
    assert jvm_archive.java_major_version(_java_that_prints(tmp_path, line)) == major


def test_a_java_older_than_13_is_refused_before_any_job(tmp_path, monkeypatch):
    (tmp_path / "jdk11").mkdir()
    _java_that_prints(tmp_path / "jdk11", 'openjdk version "11.0.21" 2023-10-17')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk11"))
    with pytest.raises(ConfigError, match="needs Java 13 or newer; .* is Java 11: set JAVA_HOME"):
        jvm_archive.build_archive(str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()  # refused before anything was made


# How a build ends when it runs too long or its caller dies is spark_dist's Python (a watcher, a process group),
# the same on both lines: those two tests run on the 3.5 line alone, whose suite is the shorter (both lines'
# suites share two cores within a 30-minute budget). The build itself is tested on both.
ON_ONE_LINE = pytest.mark.skipif(SPARK_4, reason="a build's timeout and watcher are checked on the Spark 3.5 line")


def _processes_naming(text):
    """Pids of the processes whose command line holds ``text`` (the build's job and its JVM name the partial
    file they dump to)."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if text in " ".join(p.info["cmdline"] or [])]


@pytest.fixture
def stuck_python_workers(tmp_path, monkeypatch):
    """PYSPARK_PYTHON that never starts: the job's JVM comes up, runs its JVM-only jobs and then waits for
    the first Python worker for ever. Returns the file where that worker writes its pid."""
    pid_file = tmp_path / "worker.pid"
    script = tmp_path / "stuck-python"
    script.write_text(f"#!/bin/sh\necho $$ > '{pid_file}'\nexec sleep 600\n")
    script.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(script))
    yield pid_file
    if pid_file.exists():
        for pid in running([int(pid_file.read_text())]):  # only where the test failed to end it
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temp dir of this process and of the processes it starts, where a build makes its job's temp
    directory."""
    path = tmp_path / "temp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))  # tempfile has read TMPDIR already in this process
    return path


@ON_ONE_LINE
def test_a_build_past_its_timeout_is_stopped_and_leaves_nothing(tmp_path, stuck_python_workers, temp_dir):
    directory = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="ran past 20 s and was stopped"):
        jvm_archive.build_archive(str(directory), timeout=20)
    assert os.listdir(directory) == []
    assert os.listdir(temp_dir) == []  # the job's temp directory: Spark's local directories, its Parquet files
    # Neither the job's Python nor its JVM (killed, the JVM may take a moment to be gone).
    assert still_running_after(_processes_naming(str(directory)), 15) == []
    if stuck_python_workers.exists():  # the JVM got as far as its first Python worker: that went too
        assert still_running_after([int(stuck_python_workers.read_text())], 10) == []


@ON_ONE_LINE
def test_a_build_whose_caller_is_killed_ends_itself(tmp_path, stuck_python_workers, temp_dir):
    """The caller killed outright (SIGKILL: no clean-up runs) while the job's JVM is up: the job ends its
    process group (the JVM killed dumps no archive), so nothing keeps running and nothing is written."""
    directory = tmp_path / "cache"
    caller = subprocess.Popen([sys.executable, "-c", "import sys; from spark_dist import jvm_archive; "
                               "jvm_archive.build_archive(sys.argv[1])", str(directory)], start_new_session=True)
    try:
        _wait_for("the job's JVM to ask for a Python worker", stuck_python_workers.exists, 180)
        worker = int(stuck_python_workers.read_text())
        caller.kill()
        caller.wait()
        assert still_running_after(_processes_naming(str(directory)) + [worker], 15) == []
        assert os.listdir(directory) == []
        # Spark's local directories, the JVM's native libraries, the Parquet files, the estimator's cache:
        # all in the job's temp directory, removed once the job's processes are gone.
        _wait_for("the job's temp directory to be removed", lambda: os.listdir(temp_dir) == [], 15)
    finally:
        for pid in _processes_naming(str(directory)):  # only where the assertion above failed
            os.kill(pid, signal.SIGKILL)
        if caller.poll() is None:
            caller.kill()
            caller.wait()


def test_the_job_run_by_hand_with_a_pid_not_its_parent_refuses_to_watch(tmp_path):
    """The watcher kills its process group when its parent goes; run by hand, that group would be the shell's."""
    result = run_command([sys.executable, "-m", "spark_dist.cli.jvm_archive", str(tmp_path / "x.jsa"), "1"], timeout=60)
    assert result.returncode != 0
    assert "not by build_archive in 1" in result.stderr
    assert os.listdir(tmp_path) == []
