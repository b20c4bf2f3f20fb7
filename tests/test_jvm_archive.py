"""The JVM class archive (spark_dist.jvm_archive): built once per Java and Spark, used by sessions started with it.

One archive is built for the module (about a minute, by ``spark-dist jvm-archive`` into a temporary cache
directory); a session started with its option runs in a subprocess, because driver JVM options only take effect
in a JVM started with them and this test process may already hold one.
"""
import os
import re
import shutil
import sys
import textwrap

import pytest

from spark_dist import jvm_archive
from spark_dist.errors import ConfigError
from test_cli import run_command, spark_dist


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``spark-dist jvm-archive --cache-dir D``: its output line and D."""
    directory = str(tmp_path_factory.mktemp("jvm-archives"))
    result = spark_dist("jvm-archive", "--cache-dir", directory, timeout=420)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout.strip(), directory


def test_the_command_builds_it_and_prints_the_spark_defaults_line(built):
    line, directory = built
    path = jvm_archive.archive_path(directory)
    assert line == f"spark.driver.extraJavaOptions -XX:SharedArchiveFile={path}"
    assert os.path.getsize(path) > 10 << 20  # thousands of classes, not an empty dump
    assert os.listdir(directory) == [os.path.basename(path)]  # the partial file was renamed, nothing else


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
    from spark_dist import jvm_archive

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


def test_each_java_and_spark_jars_get_their_own_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", str(_fake_spark_home(tmp_path / "spark", ["a.jar", "b.jar"])))
    first = jvm_archive.archive_path(str(tmp_path))
    assert jvm_archive.archive_path(str(tmp_path)) == first
    (tmp_path / "spark" / "jars" / "c.jar").write_bytes(b"PK")  # an upgrade adds or replaces jars
    second = jvm_archive.archive_path(str(tmp_path))
    assert second != first
    # Another Java installation (here a copy of this one's binary under its own JAVA_HOME).
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    shutil.copy(os.path.realpath(jvm_archive.java_binary()), tmp_path / "jdk" / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jvm_archive.archive_path(str(tmp_path)) not in (first, second)


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


def test_the_real_java_is_17_or_newer():
    assert jvm_archive.java_major_version(jvm_archive.java_binary()) >= 17  # what Spark 4 needs


def test_a_build_past_its_timeout_leaves_no_file_and_no_process(tmp_path):
    directory = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="ran past 15 s and was stopped"):
        jvm_archive.build_archive(str(directory), timeout=15)
    assert os.listdir(directory) == []
    # Neither the job's Python nor its JVM (whose command lines name the partial file in this directory).
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(directory).encode() in f.read():
                    alive.append(pid)
        except OSError:
            pass
    assert alive == []
