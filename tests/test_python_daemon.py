"""spark_dist.python_daemon: which daemon forks a local session's Python workers.

A session spark_dist starts names spark_dist_daemon in its conf (``conf_default``); a local session you started
yourself gets it at its first run or fit, where no Python worker has started yet (``use_in_session``). The sessions
whose daemon is chosen run in a subprocess: a daemon is chosen once per SparkContext, and this process's shared
session has started its Python workers long since.
"""
import json
import os
import sys
import textwrap

from spark_dist import jvm, python_daemon
from spark_dist.python_daemon import KEY, MODULE, conf_default, runs_this_environment
from test_cli import run_command


def test_the_workers_run_this_environment_by_path_or_by_name_on_path(monkeypatch):
    assert runs_this_environment(sys.executable)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # as Spark finds PySpark's default "python3"
    assert runs_this_environment(os.path.basename(sys.executable))
    assert not runs_this_environment("no-such-python")


def test_the_same_interpreter_linked_from_another_environment_is_another_environment(tmp_path):
    """Two virtual environments' pythons link to one interpreter; only this one's folder finds spark_dist_daemon."""
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(os.path.realpath(sys.executable))
    assert not runs_this_environment(str(other))
    assert not runs_this_environment(str(tmp_path / "bin" / "missing"))


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


def test_a_spark_connect_session_is_left_as_it_is(spark_connect):
    assert not python_daemon.use_in_session(spark_connect)


SESSIONS = textwrap.dedent("""
    import json, os, sys, time
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from spark_dist import Distributor, jvm

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
        before = sc.parallelize(range(2), 2).mapPartitions(origins).collect() if python_first else []
        total = Distributor(num_processes=2).run(ranks)
        squares = [r[0] for r in spark.range(4).select(udf(lambda x: x * x, "long")("id")).collect()]
        after = sc.parallelize(range(2), 2).mapPartitions(origins).collect()
        daemons = [list(c.info().arguments().get()) for c in
                   sc._jvm.java.lang.ProcessHandle.current().children().toArray()]
        report = {"ranks": total, "squares": squares, "before": before, "after": after,
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

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    result = run_command([sys.executable, "-c", SESSIONS], timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    installed = os.path.join(os.path.dirname(pyspark.__file__), "__init__.py")
    fresh, python_first = report["fresh"], report["python_first"]
    for seen in (fresh, python_first):
        assert seen["ranks"] == [0, 1] and seen["squares"] == [0, 1, 4, 9]  # 2 ranks over gloo; a Python UDF
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
