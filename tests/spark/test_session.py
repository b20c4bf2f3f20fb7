"""What spark_dist asks of a session: the Spark Connect substitutes that read the conf (pure functions), and
which Python workers a classic session's runs use (the SQL UDFs', by construction: its jobs are mapInArrow)."""
import os

import pytest

from clusters import SPARK_4
from spark_dist.spark.session import is_connect, run_on_executors, slots_from_conf

CLUSTER = {"spark.master": "spark://h:7077", "spark.executor.instances": "2", "spark.executor.cores": "8"}


@pytest.mark.parametrize("conf, slots", [
    ({"spark.master": "local"}, 1),
    ({"spark.master": "local[2]"}, 2),
    ({"spark.master": "local[4, 3]"}, 4),                                   # with task retries
    ({"spark.master": "local[4]", "spark.task.cpus": "2"}, 2),
    ({"spark.master": "local-cluster[2,2,1024]"}, 4),
    (CLUSTER, 16),
    ({**CLUSTER, "spark.task.cpus": "4"}, 4),
    # Tasks that take a GPU: as many slots as the executors' GPUs allow.
    ({**CLUSTER, "spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1"}, 2),
    ({**CLUSTER, "spark.executor.resource.gpu.amount": "4", "spark.task.resource.gpu.amount": "0.5"}, 16),
    # The conf does not say: Spark's own barrier check applies.
    ({"spark.master": "local[*]"}, None),
    ({"spark.master": "spark://h:7077"}, None),
    ({**CLUSTER, "spark.dynamicAllocation.enabled": "true"}, None),
])
def test_slots_from_the_conf_under_spark_connect(conf, slots):
    assert slots_from_conf(conf) == slots


def test_a_classic_session_is_not_a_connect_one(spark_local):
    assert not is_connect(spark_local) and not is_connect(None)


def test_a_runs_tasks_run_in_the_python_workers_of_the_sessions_udfs(spark_local):
    """One daemon forks both: a fit's model transform (a pandas_udf) then reuses the run's workers, which hold
    torch, instead of starting a daemon and workers of its own."""
    import pandas as pd
    from pyspark.sql import functions as F

    from spark_dist import Distributor

    environment = dict(spark_local.sparkContext.environment)

    def daemon_of_the_ranks_worker():
        import psutil

        return psutil.Process(os.getppid()).ppid()  # a rank's parent is its task's Python worker

    @F.pandas_udf("long")
    def daemon_of_this_worker(ids: pd.Series) -> pd.Series:
        return ids * 0 + os.getppid()

    run_daemon = Distributor(num_processes=2, spark=spark_local).run(daemon_of_the_ranks_worker)
    udf_daemons = {row[0] for row in spark_local.range(2).repartition(2).select(daemon_of_this_worker("id"))
                   .collect()}
    assert udf_daemons == {run_daemon}
    assert spark_local.sparkContext.environment == environment  # the session's own is left as it was


def _workers_variables(spark):
    """The traceback variables of the Python workers that run a small spark_dist job (run_on_executors)."""
    return set(run_on_executors(spark, 2, lambda _: [k for k in os.environ if k.startswith("SPARK_")
                                                     and k.endswith("TRACEBACK")]))


def _udf_workers_variables(spark):
    """The traceback variables of the Python workers that run a pandas_udf of the session."""
    import pandas as pd
    from pyspark.sql import functions as F

    @F.pandas_udf("string")
    def variables(ids: pd.Series) -> pd.Series:
        names = ",".join(k for k in os.environ if k.startswith("SPARK_") and k.endswith("TRACEBACK"))
        return ids.map(lambda _: names)

    rows = spark.range(2).repartition(2).select(variables("id")).collect()
    return {name for row in rows for name in row[0].split(",") if name}


def test_spark_dists_jobs_take_the_udf_workers_environment_whatever_the_sql_conf(spark_local):
    """The variables SQL's Python runners add from the session's SQL conf reach spark_dist's jobs as they reach
    a UDF's (a key this PySpark does not know adds nothing); the session's own environment stays as it was."""
    environment = dict(spark_local.sparkContext.environment)
    assert _workers_variables(spark_local) == _udf_workers_variables(spark_local) == {"SPARK_SIMPLIFIED_TRACEBACK"}
    simplified = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
    spark_local.conf.set(simplified, "false")
    try:
        assert _workers_variables(spark_local) == _udf_workers_variables(spark_local) == set()
    finally:
        spark_local.conf.unset(simplified)
    hide = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"
    spark_local.conf.set(hide, "true")
    try:  # Spark 3.5 has no such key: its runners add nothing for it
        expected = {"SPARK_SIMPLIFIED_TRACEBACK", *({"SPARK_HIDE_TRACEBACK"} if SPARK_4 else ())}
        assert _workers_variables(spark_local) == _udf_workers_variables(spark_local) == expected
    finally:
        spark_local.conf.unset(hide)
    assert spark_local.sparkContext.environment == environment


def rank():
    from spark_dist import get_context

    return get_context().rank


@pytest.mark.skipif(int(__import__("pandas").__version__.split(".")[0]) < 3,
                    reason="PySpark warns that it does not fully support pandas only on pandas 3")
def test_a_run_repeats_no_pandas_notice_of_pysparks(spark_local):
    import warnings

    from spark_dist import Distributor

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning, however often it was shown before
        assert Distributor(num_processes=2, verbose=False).run(rank) == 0
    assert [str(w.message) for w in caught if "fully support pandas" in str(w.message)] == []
