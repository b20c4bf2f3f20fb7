"""The ``spark-dist`` command and the spark-submit entry, run as a user would: in a subprocess.

Each command starts (and stops) its own SparkSession, so every call runs in its own process group with a
timeout; the training scripts in tests/scripts/ are plain torchrun scripts.
"""
import os
import subprocess
import sys

import pytest

from commands import (BIN, Result, CLUSTER_CONF, FAIL, REPO, SCRIPTS, TRAIN, assert_trained, load_snapshot,
                      run_command, spark_dist)


# ------------------------------------------------------------------------------------- usage (no Spark)
def test_help_documents_every_option():
    top = spark_dist("--help")
    assert top.returncode == 0
    assert "run" in top.stdout and "submit-path" in top.stdout and "exit codes" in top.stdout
    run = spark_dist("run", "--help")
    assert run.returncode == 0
    for option in ("--master", "--num-processes", "--backend", "--local-mode", "--use-gpu", "--max-retries",
                   "--min-processes", "--timeout", "--conf", "--properties-file", "--run-id", "--checkpoint-dir",
                   "--layout", "script"):
        assert option in run.stdout, option
    for code in ("0", "1", "2", "124"):
        assert f"\n  {code} " in run.stdout


def test_console_script_runs_the_same_command():
    result = run_command([os.path.join(BIN, "spark-dist"), "run", "--help"])
    assert result.returncode == 0
    assert result.stdout.startswith("usage: spark-dist run")


@pytest.mark.parametrize("args, message", [
    (["run", "--num-processes", "two", TRAIN], "invalid int value: 'two'"),
    (["run", "--bogus", TRAIN], "unrecognized arguments: --bogus"),
    (["run", "--backend", "mpi", TRAIN], "invalid choice: 'mpi'"),
    (["run", "--conf", "spark.executor.memory", TRAIN], "expected key=value"),
    (["run", "--timeout", "-3", TRAIN], "must be > 0"),
    (["run"], "the following arguments are required: script"),
    (["launch", TRAIN], "invalid choice: 'launch'"),
])
def test_bad_usage_exits_2(args, message):
    result = spark_dist(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def started_a_jvm(result):
    """Whether the command started a JVM: every JVM the tests' commands start says so on its stderr, as it reads
    the JAVA_TOOL_OPTIONS that tests/conftest.py sets for all of them (a direct check where a time bound, on a
    loaded machine, would be a guess)."""
    assert "JAVA_TOOL_OPTIONS" in os.environ  # set by conftest.py, inherited by the commands
    return "Picked up JAVA_TOOL_OPTIONS" in result.stderr


def test_missing_script_exits_2_without_starting_spark(tmp_path):
    result = spark_dist("run", "--master", "local[2]", "-n", "2", tmp_path / "no_such.py", "--lr", "1")
    assert result.returncode == 2
    assert "no_such.py' not found" in result.stderr
    assert "SparkContext" not in result.stderr and not started_a_jvm(result)


def test_bad_setting_exits_2_naming_it_before_starting_spark():
    result = spark_dist("run", "--master", "local[2]", "--num-processes", "0", TRAIN, "--snapshot", "x")
    assert result.returncode == 2
    assert "configuration error: num_processes has to be a positive integer" in result.stderr
    assert not started_a_jvm(result)


def test_options_after_the_script_belong_to_the_script(tmp_path):
    # "--help" and "--master" after the script path are the script's: spark-dist does not take them.
    result = spark_dist("run", tmp_path / "missing.py", "--help", "--master", "x")
    assert result.returncode == 2
    assert "missing.py' not found" in result.stderr


def test_submit_path_names_the_file_spark_submit_runs():
    result = spark_dist("submit-path")
    assert result.returncode == 0
    path = result.stdout.strip()
    assert path == os.path.join(REPO, "spark_dist", "cli", "submit_entry.py")
    assert os.path.isfile(path)


# ------------------------------------------------------------------------------- local mode and torchrun
WAIT_FOR_CTRL_C = """import os, sys, time
open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("where", [["--local-mode"], ["--master", "local[2]"]], ids=["local-mode", "local[2]"])
def test_ctrl_c_exits_130_and_stops_the_ranks(tmp_path, where):
    """Ctrl-C as a terminal sends it: SIGINT to the command's whole process group (the driver, and on local[2]
    its JVM), once both ranks run."""
    import signal
    import time

    from clusters import still_running_after

    script = tmp_path / "wait_for_ctrl_c.py"
    script.write_text(WAIT_FOR_CTRL_C)
    proc = subprocess.Popen([sys.executable, "-m", "spark_dist", "run", *where, "-n", "2", str(script), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(tmp_path.glob("rank*.pid"))) == 2, proc.poll()
        time.sleep(0.5)  # both pid files are complete
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it (a gateway JVM)
        except ProcessLookupError:
            pass
        proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "spark-dist: interrupted" in err
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert still_running_after(pids) == []  # the ranks (each in a session of its own) were stopped too


def test_timeout_exits_124(tmp_path):
    result = spark_dist("run", "--local-mode", "-n", "2", "--timeout", "3", os.path.join(SCRIPTS, "sleep_forever.py"))
    assert result.returncode == 124
    assert "timed out" in result.stderr and "timeout=3s" in result.stderr


def test_torchrun_script_runs_unchanged_and_resumes_its_snapshot(tmp_path):
    """A torchrun script (its own snapshot, torchrun's environment variables) under spark-dist in local mode, then
    again for more epochs, resuming the snapshot the first run left. The same kind of script under real torchrun
    and on Spark barrier tasks, with the same weights: test_frameworks.py's pytorch/examples test."""
    snapshot = tmp_path / "snap.pt"
    first = spark_dist("run", "--local-mode", "--num-processes", "2", TRAIN, "--snapshot", snapshot,
                       "--epochs", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 ranks (ddp, local processes) finished" in first.stdout
    assert_trained(load_snapshot(snapshot), epochs=2, starts=[0])

    resumed = spark_dist("run", "--local-mode", "--num-processes", "2", TRAIN, "--snapshot", snapshot,
                         "--epochs", "3", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from epoch 2 of {snapshot}" in resumed.stdout
    assert_trained(load_snapshot(snapshot), epochs=3, starts=[0, 2])


# ------------------------------------------------------------------------------------------ local[2]
def test_failing_rank_exits_1_with_that_ranks_traceback(tmp_path):
    result = spark_dist("run", "--master", "local[2]", "--num-processes", "2", FAIL, "--rank", "1", cwd=tmp_path)
    assert result.returncode == 1
    assert "training failed: rank 1 on host 127.0.0.1 raised ValueError: corrupt record in shard 1" in result.stderr
    report = result.stderr[result.stderr.index("training failed:"):]
    assert "Traceback on that rank:" in report
    assert 'fail_on_rank.py", line 17, in load_batch' in report
    assert "finished in" not in result.stdout


def test_spark_conf_error_exits_2_naming_the_key(tmp_path):
    result = spark_dist("run", "--master", "local[2]", "--conf", "spark.dynamicAllocation.enabled=true",
                        "-n", "2", TRAIN, "--snapshot", tmp_path / "s.pt", cwd=tmp_path)
    assert result.returncode == 2
    assert "configuration error:" in result.stderr
    assert "spark.dynamicAllocation.enabled=false" in result.stderr
    assert started_a_jvm(result)  # a Spark setting: checked by a session (what the tests above rule out)
    assert not (tmp_path / "s.pt").exists()


# --------------------------------------------------------------------------------- standalone cluster
# spark-submit's way onto the cluster; `spark-dist run --master <url>` builds its session as for local[2] above.
def spark_submit(cluster, spark_args, entry_args, cwd) -> Result:
    """spark-submit [spark_args] $(spark-dist submit-path) [entry_args], as a user types it."""
    path = spark_dist("submit-path").stdout.strip()
    return run_command([cluster.spark_submit, "--master", cluster.master_url,
                        "--conf", "spark.driver.host=127.0.0.1", *CLUSTER_CONF, *spark_args,
                        path, *map(str, entry_args)], cwd=cwd)


def test_spark_submit_on_standalone_cluster(standalone_cluster, tmp_path):
    snapshot = tmp_path / "snap.pt"
    result = spark_submit(standalone_cluster, ["--name", "submitted"],
                          ["--num-processes", "2", TRAIN, "--snapshot", snapshot, "--epochs", "2"], tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "2 ranks (ddp, Spark barrier tasks) finished" in result.stdout
    assert_trained(load_snapshot(snapshot), epochs=2, starts=[0])


def test_spark_submit_passes_on_the_failure_exit_code(standalone_cluster, tmp_path):
    result = spark_submit(standalone_cluster, [], ["--num-processes", "2", FAIL, "--rank", "0"], tmp_path)
    assert result.returncode == 1
    # spark-submit merges the Python driver's stderr into its own stdout.
    output = result.stdout + result.stderr
    assert "training failed: rank 0 on host 127.0.0.1 raised ValueError: corrupt record in shard 0" in output
    assert 'in load_batch' in output


def test_spark_submit_entry_leaves_master_to_spark_submit(standalone_cluster, tmp_path):
    result = spark_submit(standalone_cluster, [], ["--master", "local[2]", TRAIN], tmp_path)
    assert result.returncode == 2
    assert "--master is spark-submit's option here" in result.stdout + result.stderr


# ------------------------------------------------------------------------ session settings (in-process)
def parse_run(*argv):
    from spark_dist.cli.commands import build_parser

    return build_parser().parse_args(["run", *argv])


def test_session_conf_precedence_properties_then_conf_then_master(tmp_path, monkeypatch):
    from spark_dist.cli.commands import session_conf

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)  # the workers run this Python: spark_dist_daemon
    props = tmp_path / "p.conf"
    props.write_text("spark.master local[4]\nspark.executor.memory 2g\nspark.sql.shuffle.partitions 8\n")
    args = parse_run("--properties-file", str(props), "--conf", "spark.executor.memory=3g",
                     "--master", "local[2]", TRAIN, "--master", "ignored")
    assert session_conf(args) == {"spark.master": "local[2]", "spark.executor.memory": "3g",
                                  "spark.sql.shuffle.partitions": "8", "spark.ui.showConsoleProgress": "false",
                                  "spark.python.daemon.module": "spark_dist_daemon"}
    assert args.script_args == ["--master", "ignored"]


def test_a_local_masters_python_daemon_imports_the_installed_pyspark_unless_you_chose_one(monkeypatch):
    """spark_dist_daemon where the workers run this Python (tests/test_spark_dist_daemon.py runs it): a Python
    that cannot import it (a cluster's executors, another environment) would start no Python task at all."""
    from spark_dist.cli.commands import session_conf

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)  # a local master's workers then run this interpreter
    assert session_conf(parse_run("--master", "local[2]", TRAIN))["spark.python.daemon.module"] == "spark_dist_daemon"
    mine = parse_run("--master", "local[2]", "--conf", "spark.python.daemon.module=my_daemon", TRAIN)
    assert session_conf(mine)["spark.python.daemon.module"] == "my_daemon"
    other_python = parse_run("--master", "local[2]", "--conf", "spark.pyspark.python=/opt/py/bin/python", TRAIN)
    cluster = parse_run("--master", "spark://127.0.0.1:7077", TRAIN)
    no_master = parse_run(TRAIN)  # Spark's default master, decided after this: left alone
    for args in (other_python, cluster, no_master):
        assert "spark.python.daemon.module" not in session_conf(args)
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    assert "spark.python.daemon.module" not in session_conf(parse_run("--master", "local[2]", TRAIN))


def test_driver_host_follows_spark_local_ip_only_when_set(monkeypatch):
    from spark_dist.cli.commands import session_conf

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert "spark.driver.host" not in session_conf(parse_run(TRAIN))  # Spark picks the address itself
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    assert session_conf(parse_run(TRAIN))["spark.driver.host"] == "10.1.2.3"
    explicit = parse_run("--conf", "spark.driver.host=node7", TRAIN)
    assert session_conf(explicit)["spark.driver.host"] == "node7"


def test_run_gives_the_driver_jvm_no_options_of_its_own(tmp_path, monkeypatch):
    """No class archive (-XX:SharedArchiveFile) nor any other JVM option from spark_dist: the driver JVM of
    `spark-dist run` gets only the options you give (docs/speedups.md has a class archive recipe)."""
    from spark_dist.cli.commands import session_conf

    # An archive an earlier spark_dist built where it kept them is not picked up either.
    os.makedirs(tmp_path / "jvm")
    (tmp_path / "jvm" / "classes.jsa").write_bytes(b"")
    monkeypatch.setenv("SPARK_DIST_CACHE", str(tmp_path))
    for argv in ([TRAIN], ["--master", "local[2]", TRAIN], ["--master", "local[2]", "-n", "2", TRAIN]):
        conf = session_conf(parse_run(*argv))
        assert "spark.driver.extraJavaOptions" not in conf and "spark.driver.defaultJavaOptions" not in conf
        assert not any("SharedArchiveFile" in value or "-Xshare" in value for value in conf.values())
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa -Dmine=1", "-Dmine=1"):
        conf = session_conf(parse_run("--master", "local[2]", "--conf", f"spark.driver.extraJavaOptions={own}", TRAIN))
        assert conf["spark.driver.extraJavaOptions"] == own  # yours, as given
    top = spark_dist("--help")
    assert top.returncode == 0 and "archive" not in top.stdout.lower()
    assert spark_dist("jvm-archive").returncode == 2  # no such command


def test_under_spark_submit_only_explicit_settings_are_added(monkeypatch):
    """spark-submit's own --conf (driver host, progress bar) must not be overridden by defaults."""
    from spark_dist.cli import submit_entry
    from spark_dist.cli.commands import session_conf

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    args = submit_entry.build_parser().parse_args(["--conf", "spark.executor.memory=3g", TRAIN])
    assert session_conf(args) == {"spark.executor.memory": "3g"}


def test_conf_path_names_the_templates_and_the_wheel_ships_them(tmp_path):
    import shutil
    import zipfile

    result = spark_dist("conf-path")
    assert result.returncode == 0
    assert os.path.isfile(os.path.join(result.stdout.strip(), "spark-defaults.gpu-yarn.conf"))
    # Build the wheel from a copy of the sources (nothing is written into the checkout) and look inside.
    src = tmp_path / "src"
    src.mkdir()
    for file in ("setup.py", "spark_dist_daemon.py"):
        shutil.copy(os.path.join(REPO, file), src)
    for folder in ("spark_dist", "conf"):
        shutil.copytree(os.path.join(REPO, folder), src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("spark_dist-*.whl"))).namelist()
    shipped = {n.rsplit("/", 1)[1] for n in names if "/share/spark_dist/conf/" in n}
    assert shipped == set(os.listdir(os.path.join(REPO, "conf")))
    assert "spark_dist_daemon.py" in names  # a module of its own, beside the package (README)


def test_layout_option_reaches_the_distributor():
    from spark_dist.cli.commands import make_distributor

    assert make_distributor(parse_run(TRAIN))._args["layout"] == "host"
    assert make_distributor(parse_run("--layout", "task", TRAIN))._args["layout"] == "task"
