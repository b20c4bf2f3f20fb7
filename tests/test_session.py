"""What spark_dist asks of a session: the Spark Connect substitutes that read the conf (pure functions)."""
import pytest

from spark_dist.session import is_connect, slots_from_conf

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
