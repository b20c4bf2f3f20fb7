"""spark_dist.spark.python_daemon: which daemon forks a local session's Python workers.

A session spark_dist creates itself (``spark-dist run``, the demo) names spark_dist_daemon in its conf
(``conf_default``); a session you build yourself is never changed: its first run or fit leaves its conf and its
daemon as they were. That session runs in a subprocess, fresh (this process's shared local session names its
daemon in its conf, tests/clusters.py, and its workers hold what earlier tests imported).
"""
import json
import os
import sys
import textwrap

import pytest

from spark_dist.spark import jvm
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


OWN_SESSION = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from spark_dist import Distributor
    from spark_dist.ml import TorchEstimator

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

    def checked_loss(output, label):  # called at every step, after the optimizer is made and has stepped
        import torch.nn.functional as F
        if "torch._dynamo" in sys.modules:
            raise RuntimeError("this rank imported torch._dynamo")
        return F.cross_entropy(output, label)

    spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    sc = spark.sparkContext
    key = lambda: sc._jsc.sc().conf().get("spark.python.daemon.module", None)
    report = {"key_before": key()}
    import torch
    torch.manual_seed(0)
    rows = [([float(i % 7), float(i % 3)], i % 2) for i in range(64)]
    df = spark.createDataFrame(rows, "features array<float>, label long")
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fitted = TorchEstimator(model=model, loss=checked_loss, numProcesses=2, epochs=2, batchSize=8).fit(df)
    report["path"] = fitted.trainingPath()
    report["key_after_fit"] = key()
    report["ranks"] = Distributor(num_processes=2).run(ranks)
    report["squares"] = [r[0] for r in spark.range(4).select(udf(lambda x: x * x, "long")("id")).collect()]
    report["workers"] = sc.parallelize(range(2), 2).mapPartitions(origins).collect()
    children = [c.info().arguments() for c in sc._jvm.java.lang.ProcessHandle.current().children().toArray()]
    report["daemons"] = [list(a.get()) for a in children if a.isPresent()]  # not one exiting at this moment
    report["key_after_run"] = key()
    report["conf_after"] = sc.getConf().get("spark.python.daemon.module", None)
    spark.stop()
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def own_session(tmp_path_factory):
    """What a user's own plain ``SparkSession.builder`` local session saw through a fit and a run (OWN_SESSION)."""
    # PySpark's default workers' Python: "python3" on PATH, here this environment's (spark_dist_daemon would serve).
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]))
    result = run_command([sys.executable, "-c", OWN_SESSION], timeout=300, cwd=tmp_path_factory.mktemp("own"),
                         env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_users_own_session_is_not_changed_by_a_fit_or_a_run(own_session):
    """spark.python.daemon.module unset before and after; PySpark's own daemon forks every Python worker."""
    assert own_session["ranks"] == [0, 1] and own_session["squares"] == [0, 1, 4, 9]  # 2 ranks; a Python UDF
    assert own_session["key_before"] is None
    assert own_session["key_after_fit"] is None and own_session["key_after_run"] is None
    assert own_session["conf_after"] is None
    assert [w["daemon"] for w in own_session["workers"]] == ["pyspark.daemon"] * 2
    assert {args[args.index("-m") + 1] for args in own_session["daemons"] if "-m" in args} == {"pyspark.daemon"}


def test_a_fit_on_the_replicas_path_does_not_import_torch_dynamo(own_session):
    """A small CPU model trains as Replicas with torch's functional optimizer: its ranks, fresh in a fresh session,
    never import torch._dynamo (the loss checks at every step; it would fail the fit)."""
    assert own_session["path"]["ranks"] == "replicas"
    assert own_session["path"]["optimizer"] == "torch.optim.adam.adam (functional)"
