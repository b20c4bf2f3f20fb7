"""GPU slots on a local-cluster with fake GPUs: which GPU each rank sees, and how many ranks fit."""
import os

import pytest

from spark_dist import ConfigError, Distributor, get_context
from spark_dist.wire.ranks import visible_devices
from spark_dist.spark.session import task_slots


def gpu_view():
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the GPUs are fake: talk over gloo
    ctx = get_context()
    views = [None] * ctx.world_size
    dist.all_gather_object(views, (ctx.rank, ctx.local_rank, ctx.gpus, os.environ["CUDA_VISIBLE_DEVICES"],
                                   str(ctx.device)))
    dist.destroy_process_group()
    return views


def test_each_rank_sees_its_own_gpu_at_cuda_local_rank(spark_local_cluster):
    views = Distributor(num_processes=2, use_gpu=True, verbose=False).run(gpu_view)
    assert sorted(g for v in views for g in v[2]) == ["0", "1"]  # one distinct GPU per task
    for rank, local_rank, gpus, visible, device in views:
        assert visible == "0,1"  # this host's task GPUs, in local-rank order
        assert visible.split(",")[local_rank] == gpus[0]
        assert device == f"cuda:{local_rank}"


def test_the_pyspark_layout_gives_each_one_gpu_task_its_own_gpu_and_local_rank_zero(spark_local_cluster):
    views = Distributor(num_processes=2, use_gpu=True, verbose=False, layout="task").run(gpu_view)
    for rank, local_rank, gpus, visible, device in views:
        assert (local_rank, visible, device) == (0, gpus[0], "cuda:0")  # only its own GPU, at cuda:0
    assert sorted(v[3] for v in views) == ["0", "1"]


@pytest.mark.parametrize("layout", ["host", "task"])
def test_a_task_of_two_gpus_runs_a_rank_on_each(spark_multi_gpu_tasks, layout):
    # Two tasks of two GPUs ("0","1" and "2","3"): four ranks, one per GPU, in either layout.
    views = Distributor(num_processes=4, use_gpu=True, verbose=False, layout=layout).run(gpu_view)
    assert sorted(g for v in views for g in v[2]) == ["0", "1", "2", "3"]
    for rank, local_rank, gpus, visible, device in views:
        assert len(gpus) == 1 and visible.split(",")[local_rank] == gpus[0]  # cuda:LOCAL_RANK is its own GPU
        assert device == f"cuda:{local_rank}"
    if layout == "task":  # PySpark 4.2+: each task a node of two processes, seeing the task's two GPUs
        assert sorted((v[1], v[3]) for v in views) == [(0, "0,1"), (0, "2,3"), (1, "0,1"), (1, "2,3")]


def test_ranks_must_fill_whole_multi_gpu_tasks(spark_multi_gpu_tasks):
    with pytest.raises(RuntimeError, match=r"num_processes \(3\) must be a multiple of"):
        Distributor(num_processes=3, use_gpu=True, verbose=False).run(gpu_view)


def test_gpu_slots_bound_the_number_of_ranks(spark_local_cluster):
    assert task_slots(spark_local_cluster) == 2
    spark_local_cluster.conf.set("spark.dist.slotWaitTimeout", "1")
    try:
        with pytest.raises(ConfigError, match="num_processes=3 but the cluster has 2 GPU task slots"):
            Distributor(num_processes=3, use_gpu=True, verbose=False).run(gpu_view)
    finally:
        spark_local_cluster.conf.unset("spark.dist.slotWaitTimeout")


def test_local_mode_ranks_take_the_drivers_spark_gpus(spark_local_cluster, monkeypatch):
    # The driver's two fake GPUs ("0", "1": spark.driver.resource.gpu.*); CUDA sees none here.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    views = Distributor(num_processes=2, local_mode=True, use_gpu=True, verbose=False).run(gpu_view)
    assert [(rank, local_rank, list(gpus), visible, device) for rank, local_rank, gpus, visible, device in views] == [
        (0, 0, ["0"], "0,1", "cuda:0"), (1, 1, ["1"], "0,1", "cuda:1")]  # one node: cuda:LOCAL_RANK is its own
    with pytest.raises(ConfigError, match=r"needs 3 GPUs on the driver, but its Spark resources have 2 \(0, 1\): "
                                          r"lower num_processes, or raise spark\.driver\.resource\.gpu\.amount"):
        Distributor(num_processes=3, local_mode=True, use_gpu=True, verbose=False).run(gpu_view)


def test_the_drivers_spark_gpus_are_positions_in_its_cuda_visible_devices_as_pyspark_reads_them(
        spark_local_cluster, monkeypatch):
    from pyspark.ml.torch.distributor import _get_gpus_owned

    from spark_dist.spark.resources import local_gpu_addresses

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")  # e.g. a container given three of the machine's GPUs
    assert local_gpu_addresses(2, spark_local_cluster) == _get_gpus_owned(spark_local_cluster) == ["5", "7"]
