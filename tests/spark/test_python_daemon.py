"""spark_dist.spark.python_daemon: which daemon forks a local session's Python workers.

A session spark_dist starts names spark_dist_daemon in its conf (``conf_default``); a local session you started
yourself gets it at its first run or fit, where no Python worker has started yet (``use_in_session``). The sessions
whose daemon is chosen run in a subprocess: a daemon is chosen once per SparkContext, and this process's shared
local session names its daemon in its conf (tests/clusters.py).
"""
import json
import os
import sys
import textwrap

from spark_dist.spark import jvm, python_daemon
from spark_dist.spark.python_daemon import KEY, MODULE, WorkersStart, conf_default, runs_this_environment
from commands import run_command


def test_the_workers_run_this_environment_by_path_or_by_name_on_path(tmp_path):
    here = WorkersStart.of_this_process({})
    assert runs_this_environment(sys.executable, here)
    # As Spark finds PySpark's default "python3": on the JVM's PATH, started in its working directory.
    on_path = here._replace(path=os.path.dirname(sys.executable), cwd=str(tmp_path))
    assert runs_this_environment(os.path.basename(sys.executable), on_path)
    assert not runs_this_environment("no-such-python", on_path)


def test_the_same_interpreter_linked_from_another_environment_is_another_environment(tmp_path):
    """Two virtual environments' pythons link to one interpreter; only this one's folder finds spark_dist_daemon."""
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(os.path.realpath(sys.executable))
    here = WorkersStart.of_this_process({})
    assert not runs_this_environment(str(other), here)
    assert not runs_this_environment(str(tmp_path / "bin" / "missing"), here)


def test_the_workers_start_with_spark_s_pythonpath_then_the_inherited_one(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    start = WorkersStart.of_this_process({"spark.executorEnv.PYTHONPATH": "/executor"})
    assert start.pythonpath == os.pathsep.join(["/executor", "/inherited"]) and start.cwd == os.getcwd()


def test_the_default_for_a_session_about_to_start():
    local = {"spark.master": "local[2]"}
    assert conf_default(local, sys.executable) == MODULE
    assert conf_default({"spark.master": "local-cluster[2,1,1024]"}, sys.executable) == MODULE
    assert conf_default({**local, KEY: "pyspark.daemon"}, sys.executable) is None  # yours is kept
    assert conf_default({**local, "spark.python.use.daemon": "false"}, sys.executable) is None  # no daemon runs
    assert conf_default(local, "/opt/py/bin/python") is None  # another Python may not import it
    assert conf_default({"spark.master": "spark://127.0.0.1:7077"}, sys.executable) is None  # executors elsewhere
    assert conf_default({}, sys.executable) is None  # Spark's default master, decided later


def test_a_session_that_ran_a_python_task_has_its_workers_started(spark_local):
    assert spark_local.sparkContext.parallelize(range(2), 2).map(lambda x: x + 1).sum() == 3
    assert jvm.python_workers_started(spark_local.sparkContext)


def test_a_choice_that_cannot_be_made_leaves_the_session_and_the_run_alone(spark_local, monkeypatch):
    """A JVM before Java 9 has no ProcessHandle: the run goes on with the session's daemon as it was."""
    def no_process_handle(sc):
        raise TypeError("'JavaPackage' object is not callable")

    monkeypatch.setattr(python_daemon, "_decided_for", set())  # the shared session counts as not yet decided
    monkeypatch.setattr(python_daemon, "conf_default", lambda conf, python, start=None: MODULE)
    monkeypatch.setattr(jvm, "python_workers_started", no_process_handle)
    assert python_daemon.use_in_session(spark_local) is False


def test_a_spark_connect_session_is_left_as_it_is(spark_connect):
    assert not python_daemon.use_in_session(spark_connect)
    assert spark_connect.conf.get(KEY, None) is None


SESSIONS = textwrap.dedent("""
    import json, os, sys, time
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from spark_dist import Distributor
    from spark_dist.spark import jvm

    def origins(_):
        import pyspark
        yield {"daemon": sys.modules["__main__"].__spec__.name, "pyspark": pyspark.__file__}

    def ranks():  # every rank hears from every other over gloo
        import torch.distributed as dist
        dist.init_process_group("gloo")
        heard = [None] * dist.get_world_size()
        dist.all_gather_object(heard, dist.get_rank())
        dist.destroy_process_group()
        return heard

    def session(python_first):
        spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        sc = spark.sparkContext
        started_at_start = jvm.python_workers_started(sc)
        before = sc.parallelize(range(2), 2).mapPartitions(origins).collect() if python_first else []
        total = Distributor(num_processes=2).run(ranks)
        squares = [r[0] for r in spark.range(4).select(udf(lambda x: x * x, "long")("id")).collect()]
        after = sc.parallelize(range(2), 2).mapPartitions(origins).collect()
        children = [c.info().arguments() for c in sc._jvm.java.lang.ProcessHandle.current().children().toArray()]
        daemons = [list(a.get()) for a in children if a.isPresent()]  # not one exiting at this moment
        report = {"started_at_start": started_at_start, "ranks": total, "squares": squares, "before": before, "after": after,
                  "key": sc._jsc.sc().conf().get("spark.python.daemon.module", None), "daemons": daemons}
        spark.stop()
        for _ in range(100):  # the stopped context's daemon exits (SIGTERM): the next session starts without one
            if not jvm.python_workers_started(sc):
                break
            time.sleep(0.1)
        return report

    print(json.dumps({"fresh": session(False), "python_first": session(True)}))
""")


def test_a_plain_local_sessions_first_run_moves_its_daemon_to_the_installed_pyspark(tmp_path):
    """A user's own ``SparkSession.builder`` session: its first run chooses spark_dist_daemon, which then forks
    the ranks' workers and every later Python task (a UDF too). A session whose Python workers had started
    keeps PySpark's daemon: no second daemon starts beside it."""
    import pyspark

    # PySpark's default workers' Python: "python3" on PATH, here this environment's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]))
    result = run_command([sys.executable, "-c", SESSIONS], timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    installed = os.path.join(os.path.dirname(pyspark.__file__), "__init__.py")
    fresh, python_first = report["fresh"], report["python_first"]
    for seen in (fresh, python_first):
        assert seen["ranks"] == [0, 1] and seen["squares"] == [0, 1, 4, 9]  # 2 ranks over gloo; a Python UDF
    assert fresh["started_at_start"] is False and python_first["started_at_start"] is False
    assert fresh["key"] == MODULE
    assert [w["daemon"] for w in fresh["after"]] == [MODULE, MODULE]
    assert [w["pyspark"] for w in fresh["after"]] == [installed, installed]
    # Every daemon the JVM started runs it (Spark 4 starts one for RDD functions and one for SQL UDFs).
    assert {args[args.index("-m") + 1] for args in fresh["daemons"] if "-m" in args} == {MODULE}
    assert python_first["key"] is None
    assert [w["daemon"] for w in python_first["before"] + python_first["after"]] == ["pyspark.daemon"] * 4
    assert all(w["pyspark"].endswith(os.path.join("pyspark.zip", "pyspark", "__init__.py"))
               for w in python_first["after"])
    assert {args[args.index("-m") + 1] for args in python_first["daemons"] if "-m" in args} == {"pyspark.daemon"}
