"""PySpark's TorchDistributor and spark_dist's drop-in, side by side: the public behaviour PySpark's own tests
(python/pyspark/ml/torch/tests/test_distributor.py) exercise, written anew, asserted alike for both classes
against the installed pyspark. Where we differ on purpose the test says so (and the README's drop-in section).
"""
import os

import pytest
from pyspark import __version__ as PYSPARK_VERSION
from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor

from spark_dist import TorchDistributor

CLASSES = [pytest.param(PySparkTorchDistributor, id="pyspark"), pytest.param(TorchDistributor, id="spark_dist")]
RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "CUDA_VISIBLE_DEVICES")
PYSPARK_4_2 = tuple(int(p) for p in PYSPARK_VERSION.split(".")[:2]) >= (4, 2)


def rank_view(scale, tag=None, datasets=None):
    """Every rank's torchrun variables (gathered over gloo), and what the function was given."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, {k: os.environ.get(k) for k in RANK_KEYS})
    dist.destroy_process_group()
    return {"views": views, "scale": scale, "tag": tag, "datasets": datasets,
            "master": bool(os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))}


@pytest.mark.parametrize("cls", CLASSES)
def test_num_processes_must_be_positive(spark_local, cls):
    with pytest.raises(ValueError, match="positive"):
        cls(num_processes=0, local_mode=True, use_gpu=False)


@pytest.mark.parametrize("cls", CLASSES)
def test_gpus_without_gpu_scheduling_fail_in_the_constructor(spark_local, cls):
    with pytest.raises(RuntimeError, match="'spark.task.resource.gpu.amount' was unset"):
        cls(num_processes=2, local_mode=False, use_gpu=True)
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver"):
        cls(num_processes=2, local_mode=True, use_gpu=True)


@pytest.mark.parametrize("cls", CLASSES)
def test_public_attributes(spark_local, cls):
    d = cls(num_processes=2, local_mode=False, use_gpu=False)
    assert (d.num_processes, d.local_mode, d.use_gpu, d.num_tasks) == (2, False, False, 2)
    assert d.ssl_conf == "pytorch.spark.distributor.ignoreSsl" and d.spark is spark_local
    assert d.is_spark_local_master and not d.is_remote
    assert d.input_params == {"num_processes": 2, "local_mode": False, "use_gpu": False, "num_tasks": 2}


@pytest.mark.parametrize("cls", CLASSES)
def test_encryption_refuses_task_runs_allows_local_mode_and_honours_the_run_time_opt_out(runtime_conf, cls):
    runtime_conf("spark.ssl.enabled", "true")
    with pytest.raises(RuntimeError, match="encryption"):
        cls(num_processes=2, local_mode=False, use_gpu=False).run(rank_view, 1.0)
    # Local mode keeps the traffic on the driver's machine: no check. Its ranks are one torchrun node.
    local = cls(num_processes=2, local_mode=True, use_gpu=False).run(rank_view, 2.0)
    assert [(v["RANK"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"]) for v in local["views"]] == [
        ("0", "0", "2"), ("1", "1", "2")]
    runtime_conf("pytorch.spark.distributor.ignoreSsl", "true")  # set at run time, as a notebook would
    out = cls(num_processes=2, local_mode=False, use_gpu=False).run(rank_view, 3.0, tag="t", datasets="mine")
    # Each task its own node: LOCAL_RANK 0, NODE_RANK the task's index; GPUs hidden with use_gpu=False.
    assert [tuple(v[k] for k in RANK_KEYS) for v in out["views"]] == [
        ("0", "0", "2", "1", "0", ""), ("1", "0", "2", "1", "1", "")]
    # Positional and keyword arguments reach the function, a keyword named `datasets` too.
    assert (out["scale"], out["tag"], out["datasets"], out["master"]) == (3.0, "t", "mine", True)


@pytest.mark.parametrize("cls", CLASSES)
def test_a_script_runs_on_every_task_and_returns_none(spark_local, cls, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      "open(os.path.join(os.path.dirname(__file__), 'rank' + os.environ['RANK']), 'w')"
                      ".write(sys.argv[1])\n")
    assert cls(num_processes=2, local_mode=False, use_gpu=False).run(str(script), "--lr=0.1") is None
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["--lr=0.1", "--lr=0.1"]


@pytest.mark.parametrize("cls", CLASSES)
def test_each_gpu_task_sees_only_its_own_gpu(spark_local_cluster, cls):
    d = cls(num_processes=2, local_mode=False, use_gpu=True)
    assert d.num_tasks == 2
    views = d.run(rank_view, 1.0)["views"]
    assert sorted((v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"], v["CUDA_VISIBLE_DEVICES"]) for v in views) == [
        ("0", "1", "0"), ("0", "1", "1")]


@pytest.mark.parametrize("cls", CLASSES)
def test_local_mode_ranks_share_the_drivers_spark_gpus(spark_local_cluster, cls):
    # The driver holds two fake GPUs ("0", "1": spark.driver.resource.gpu.*) and CUDA sees none: the ranks take
    # the driver's Spark GPUs, one node that sees them all (PySpark picks them in a random order).
    d = cls(num_processes=3, local_mode=True, use_gpu=True)
    assert d.num_processes == 2  # more ranks than the driver's GPUs: the constructor lowers it, with a warning
    views = d.run(rank_view, 1.0)["views"]
    assert [(v["RANK"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"]) for v in views] == [("0", "0", "2"), ("1", "1", "2")]
    visible = {v["CUDA_VISIBLE_DEVICES"] for v in views}
    assert len(visible) == 1 and sorted(visible.pop().split(",")) == ["0", "1"]
    d.num_processes = 3  # raised past the constructor's check: the run refuses (PySpark: random.sample's error)
    with pytest.raises(ValueError) as raised:
        d.run(rank_view, 1.0)
    if cls is TorchDistributor:
        assert "spark.driver.resource.gpu.amount" in str(raised.value)


@pytest.mark.parametrize("cls", CLASSES)
def test_tasks_of_two_gpus(spark_multi_gpu_tasks, cls):
    assert cls(num_processes=4, local_mode=False, use_gpu=True).num_tasks == 2
    if cls is PySparkTorchDistributor and not PYSPARK_4_2:
        # PySpark 3.5 accepts this, starts 2 tasks and tells torchrun to wait for 3 nodes: it would hang.
        # The drop-in follows PySpark 4.2+ on every line (README, "The drop-ins").
        assert cls(num_processes=3, local_mode=False, use_gpu=True).num_tasks == 2
        return
    with pytest.raises(RuntimeError, match="must be a multiple of 'spark.task.resource.gpu.amount'"):
        cls(num_processes=3, local_mode=False, use_gpu=True)
