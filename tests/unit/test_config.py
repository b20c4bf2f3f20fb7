"""Bad settings fail on the driver, before any Spark job, naming what to change."""
import pytest

from spark_dist import ConfigError, Distributor
from spark_dist.config import CONF_ALLOW_UNENCRYPTED, RunConfig


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_num_processes_must_be_a_positive_int(value):
    with pytest.raises(ConfigError, match="num_processes"):
        Distributor(num_processes=value)


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigError, match="backend must be one of ddp, horovod"):
        Distributor(num_processes=2, backend="mpi")


@pytest.mark.parametrize("kwargs, word", [
    ({"max_retries": -1}, "max_retries"), ({"timeout": 0}, "timeout"), ({"run_id": "a b"}, "run_id")])
def test_other_arguments_are_checked(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        Distributor(num_processes=2, **kwargs)


def test_dynamic_allocation_is_refused_by_conf_key():
    with pytest.raises(ConfigError, match="spark.dynamicAllocation.enabled=false"):
        RunConfig.build(num_processes=2, spark_conf={"spark.dynamicAllocation.enabled": "true"})


def test_use_gpu_without_gpu_scheduling_names_the_conf_key():
    with pytest.raises(ConfigError, match="spark.task.resource.gpu.amount"):
        RunConfig.build(num_processes=2, use_gpu=True, spark_conf={})
    with pytest.raises(RuntimeError):  # what PySpark raises, and code catches to fall back to the CPU
        RunConfig.build(num_processes=2, use_gpu=True, spark_conf={})


@pytest.mark.parametrize("amount, num_processes, per_task", [("1", 3, 1), ("0.5", 3, 1), ("2", 4, 2), ("4", 4, 4)])
def test_a_task_of_several_gpus_runs_a_rank_per_gpu(amount, num_processes, per_task):
    config = RunConfig.build(num_processes=num_processes, use_gpu=True,
                             spark_conf={"spark.task.resource.gpu.amount": amount})
    assert config.processes_per_task == per_task and config.num_tasks == num_processes // per_task
    # Without GPUs, and in local mode, every task (process) runs one rank.
    assert RunConfig.build(num_processes=num_processes, spark_conf={"spark.task.resource.gpu.amount": amount}
                           ).processes_per_task == 1


def test_num_processes_must_fill_whole_multi_gpu_tasks():
    with pytest.raises(RuntimeError, match="must be a multiple of 'spark.task.resource.gpu.amount' \\(2\\)"):
        RunConfig.build(num_processes=3, use_gpu=True, spark_conf={"spark.task.resource.gpu.amount": "2"})
    with pytest.raises(ConfigError, match="whole number"):
        RunConfig.build(num_processes=3, use_gpu=True, spark_conf={"spark.task.resource.gpu.amount": "1.5"})


def test_layout_is_checked():
    with pytest.raises(ConfigError, match="layout must be one of 'host', 'task'"):
        RunConfig.build(num_processes=2, layout="node")
    with pytest.raises(ConfigError, match="layout='task' cannot run backend='horovod'"):
        RunConfig.build(num_processes=2, layout="task", backend="horovod")


def test_tls_refused_unless_opted_in():
    conf = {"spark.ssl.enabled": "true"}
    with pytest.raises(ConfigError, match=CONF_ALLOW_UNENCRYPTED):
        RunConfig.build(num_processes=2, spark_conf=conf)
    with pytest.raises(RuntimeError, match="encryption"):  # PySpark's type and word
        RunConfig.build(num_processes=2, spark_conf=conf)
    # Local mode keeps the traffic on the driver's machine: allowed, as PySpark allows it.
    assert RunConfig.build(num_processes=2, local_mode=True, spark_conf=conf).ssl_enabled
    assert RunConfig.build(num_processes=2, spark_conf={**conf, CONF_ALLOW_UNENCRYPTED: "true"}).allow_unencrypted
    # TorchDistributor's own opt-in key works for people moving over.
    assert RunConfig.build(num_processes=2, spark_conf={**conf, "pytorch.spark.distributor.ignoreSsl": "true"})


def test_driver_host_comes_from_spark_conf_and_each_run_gets_its_own_id():
    a = RunConfig.build(num_processes=1, spark_conf={"spark.driver.host": "127.0.0.1"})
    b = RunConfig.build(num_processes=1)
    assert a.driver_host == "127.0.0.1" and a.run_id != b.run_id and not a.resume
    assert RunConfig.build(num_processes=1, run_id="nightly-1").resume


def test_bad_conf_values_name_the_key():
    with pytest.raises(ConfigError, match="spark.dist.slotWaitTimeout"):
        RunConfig.build(num_processes=1, spark_conf={"spark.dist.slotWaitTimeout": "soon"})


def test_listeners_bind_spark_driver_bind_address_and_ranks_dial_the_driver_host():
    # A Kubernetes client-mode driver: it advertises its service name and binds the pod's interfaces.
    config = RunConfig.build(num_processes=1, spark_conf={"spark.driver.host": "driver-svc.ns.svc",
                                                          "spark.driver.bindAddress": "0.0.0.0"})
    assert (config.driver_host, config.bind_address) == ("driver-svc.ns.svc", "0.0.0.0")
    assert RunConfig.build(num_processes=1, spark_conf={"spark.driver.host": "10.0.0.5"}).bind_address == "10.0.0.5"


@pytest.mark.parametrize("value, why", [
    ("checkpoints", "relative path"), ("./ckpt", "relative path"),
    ("hdfs://nn/ckpt", "cannot write hdfs: URLs"), ("s3a://bucket/ckpt", "cannot write s3a:"),
    ("dbfs:/ckpt", "cannot write dbfs:"),
])
def test_checkpoint_dirs_torch_save_cannot_write_are_refused_naming_the_key(value, why):
    with pytest.raises(ConfigError, match=f"checkpoint_dir={value!r}.*{why}"):
        Distributor(num_processes=1, checkpoint_dir=value)
    with pytest.raises(ConfigError, match=f"spark.dist.checkpointDir={value!r}.*{why}"):
        RunConfig.build(num_processes=1, spark_conf={"spark.dist.checkpointDir": value})


def test_checkpoint_dir_is_a_root_each_run_writes_below():
    assert RunConfig.build(num_processes=1, checkpoint_dir="file:///mnt/shared/ckpt/").checkpoint_dir == \
        "/mnt/shared/ckpt"
    assert RunConfig.build(num_processes=1, spark_conf={"spark.dist.checkpointDir": "/dbfs/ckpt"}).checkpoint_dir \
        == "/dbfs/ckpt"


@pytest.mark.parametrize("value", [0, 5, 1.5, True, "2"])
def test_min_processes_is_a_count_up_to_num_processes(value):
    with pytest.raises(ConfigError, match=r"min_processes must be an integer from 1 to num_processes \(4\)"):
        Distributor(num_processes=4, min_processes=value)


def test_min_processes_comes_from_its_conf_key_and_fills_whole_gpu_tasks():
    from spark_dist.config import CONF_MIN_PROCESSES

    assert RunConfig.build(num_processes=4, spark_conf={CONF_MIN_PROCESSES: "2"}).min_processes == 2
    assert RunConfig.build(num_processes=4, min_processes=3, spark_conf={CONF_MIN_PROCESSES: "2"}).min_processes == 3
    fixed = RunConfig.build(num_processes=4)
    assert fixed.min_processes == 4 and not fixed.elastic
    with pytest.raises(ConfigError, match="spark.dist.minProcesses must be an integer from 1 to num_processes"):
        RunConfig.build(num_processes=4, spark_conf={CONF_MIN_PROCESSES: "two"})
    with pytest.raises(RuntimeError, match=r"min_processes \(3\) must be a multiple of 'spark.task.resource.gpu"):
        RunConfig.build(num_processes=4, min_processes=3, use_gpu=True,
                        spark_conf={"spark.task.resource.gpu.amount": "2"})


def test_replacing_a_lost_hosts_executors_is_on_by_default_and_a_conf_key_leaves_it_to_spark(monkeypatch):
    # A lost host's executors: the driver asks Spark to replace them unless the user keeps their cluster to Spark.
    import types

    from spark_dist.driver import attempt
    from spark_dist.wire.ranks import RankInfo, TaskInfo

    asked = []
    monkeypatch.setattr(attempt.session, "replace_lost_executors",
                        lambda spark, stage, partitions: asked.append(partitions) or ["0"])
    rank = RankInfo(rank=1, local_rank=0, world_size=2, local_world_size=1, node_rank=1, num_nodes=2,
                    host="10.0.0.3")
    task = TaskInfo(1, "10.0.0.3", executor="10.0.0.3:40000", stage=7)
    lost = types.SimpleNamespace(silent_ranks=[1], tasks=[task], ranks=[rank], lost_ranks=[rank])
    for conf, replaced in (({}, [{1}]), ({"spark.dist.replaceLostExecutors": "false"}, [])):
        asked.clear()
        config = RunConfig.build(num_processes=2, spark_conf={"spark.master": "spark://m:7077", **conf})
        attempt.Attempt._replace_lost_executors(types.SimpleNamespace(config=config, spark=None, tag="t"), lost)
        assert asked == replaced
    with pytest.raises(ConfigError, match="spark.dist.replaceLostExecutors"):
        RunConfig.build(num_processes=2, spark_conf={"spark.dist.replaceLostExecutors": "sometimes"})
