"""The Spark set-ups of conftest.py work as promised."""
import os

from pyspark import BarrierTaskContext, SparkContext


def _java_ancestor():
    """pid of the JVM that runs this Python worker (its executor)."""
    import psutil

    p = psutil.Process()
    while p is not None and p.name() != "java":
        p = p.parent()
    return p.pid if p else None


def _barrier_info(spark, n=2):
    """Run a barrier stage of n tasks; each reports what it sees, gathered through allGather."""

    def task(_):
        ctx = BarrierTaskContext.get()
        gpus = ctx.resources().get("gpu")
        me = {
            "partition": ctx.partitionId(),
            # host:port of the executor running this task
            "executor": ctx.getTaskInfos()[ctx.partitionId()].address,
            "jvm": _java_ancestor(),
            "gpus": list(gpus.addresses) if gpus else [],
            "pid": os.getpid(),
        }
        import json

        everyone = [json.loads(s) for s in ctx.allGather(json.dumps(me))]
        return [(me, everyone)]

    return spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(task).collect()


def test_local_barrier(spark_local):
    assert spark_local.sparkContext.master == "local[2]"
    out = _barrier_info(spark_local)
    assert sorted(me["partition"] for me, _ in out) == [0, 1]
    # allGather reached both tasks: each saw both partitions
    for _, everyone in out:
        assert sorted(e["partition"] for e in everyone) == [0, 1]


def _n_executors(sc):
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver


def test_local_cluster_barrier_sees_distinct_gpus(spark_local_cluster):
    sc = spark_local_cluster.sparkContext
    assert sc.master.startswith("local-cluster[2,1,")
    assert _n_executors(sc) == 2
    out = _barrier_info(spark_local_cluster)
    assert sorted(me["partition"] for me, _ in out) == [0, 1]
    # One task per executor (1 core, 1 GPU each), each with its own fake GPU.
    assert sorted(me["gpus"][0] for me, _ in out) == ["0", "1"]
    assert all(len(me["gpus"]) == 1 for me, _ in out)
    assert len({me["executor"] for me, _ in out}) == 2
    jvms = {me["jvm"] for me, _ in out}
    assert len(jvms) == 2 and SparkContext._gateway.proc.pid not in jvms  # not the driver JVM


def test_standalone_barrier_on_two_executors(spark_standalone, standalone_cluster):
    sc = spark_standalone.sparkContext
    assert sc.master == standalone_cluster.master_url
    assert _n_executors(sc) == 2
    assert len(standalone_cluster.executor_pids()) == 2
    out = _barrier_info(spark_standalone)
    assert sorted(me["partition"] for me, _ in out) == [0, 1]
    assert len({me["executor"] for me, _ in out}) == 2
    assert sorted(me["jvm"] for me, _ in out) == sorted(standalone_cluster.executor_pids())

