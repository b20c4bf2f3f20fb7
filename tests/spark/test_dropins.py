"""Moving from PySpark's TorchDistributor is one changed import."""
import os

import pytest
import torch

from spark_dist import TorchDistributor  # was: from pyspark.ml.torch.distributor import TorchDistributor

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "databricks_train.py")


def train(learning_rate, use_gpu):
    """The function form of PySpark's documentation example."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    backend = "nccl" if use_gpu else "gloo"
    dist.init_process_group(backend)
    device = int(os.environ["LOCAL_RANK"]) if use_gpu else "cpu"
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = DDP(torch.nn.Linear(8, 2).to(device))
    loader = DataLoader(dataset, sampler=DistributedSampler(dataset), batch_size=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    dist.destroy_process_group()
    return {"weights": model.module.weight.detach(), "batches": len(losses)}


def test_the_documented_function_example_runs_unchanged(spark_local):
    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 1e-3, False)
    assert out["batches"] == 8  # 256 rows, 2 ranks, batch 16: DistributedSampler gave this rank its half
    assert out["weights"].shape == (2, 8)


def test_the_documented_file_example_runs_unchanged(spark_local, tmp_path):
    script = tmp_path / "train.py"  # the script saves each rank's weights next to itself
    script.write_bytes(open(SCRIPT, "rb").read())
    result = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        str(script), "--learning_rate=0.001", "--batch_size=16")
    assert result is None  # as PySpark's: a script returns nothing
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(w0, w1)  # DDP kept the replicas identical


def test_defaults_match_pyspark_local_mode_with_gpus(spark_local):
    # PySpark's defaults: local_mode=True, use_gpu=True. Without GPUs on the driver the constructor raises
    # PySpark's RuntimeError (code catches it to fall back to the CPU), naming what to change.
    from spark_dist import ClusterConfigError

    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver") as raised:
        TorchDistributor()
    assert isinstance(raised.value, ClusterConfigError)
    d = TorchDistributor(use_gpu=False)
    assert (d.num_processes, d.local_mode, d.use_gpu, d.num_tasks) == (1, True, False, 1)


def report_layout(tag):
    """What a rank sees of its place, as PySpark's recipes read it."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "CUDA_VISIBLE_DEVICES")
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, {**{k: os.environ.get(k) for k in keys}, "tag": tag})
    dist.destroy_process_group()
    return seen


def test_each_task_is_a_node_and_gpus_are_hidden_as_in_pyspark(spark_local):
    # local[2]: both tasks on one host. PySpark gives each task LOCAL_RANK 0 (its own torchrun node).
    seen = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(report_layout, tag="x")
    assert [(s["RANK"], s["LOCAL_RANK"], s["LOCAL_WORLD_SIZE"], s["NODE_RANK"], s["GROUP_RANK"]) for s in seen] == [
        ("0", "0", "1", "0", "0"), ("1", "0", "1", "1", "1")]
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["", ""]  # use_gpu=False hides the GPUs
    assert seen[0]["tag"] == "x"


def test_every_keyword_goes_to_the_function_and_datasets_have_a_method_of_their_own(spark_local):
    def echo(datasets=None, **kwargs):
        from spark_dist import get_context

        return datasets, kwargs, sorted(get_context().datasets)

    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    # PySpark passes every keyword to the function: one named `datasets` too.
    assert d.run(echo, datasets="mine", lr=0.1) == ("mine", {"lr": 0.1}, [])
    frame = spark_local.range(8).selectExpr("cast(id as float) as x")
    assert d.run_with_datasets({"train": frame}, echo, lr=0.1) == (None, {"lr": 0.1}, ["train"])


def test_pyspark_attributes_are_there_and_drive_the_next_run(spark_local):
    d = TorchDistributor(num_processes=1, local_mode=False, use_gpu=False)
    assert d.input_params == {"num_processes": 1, "local_mode": False, "use_gpu": False, "num_tasks": 1}
    assert d.ssl_conf == "pytorch.spark.distributor.ignoreSsl" and d.spark is spark_local
    assert d.is_spark_local_master and not d.is_remote
    d.num_processes = 2  # code that adjusts the attribute before run() gets what it set
    assert len(d.run(report_layout, tag="y")) == 2


def test_gpu_runs_need_gpu_scheduling_in_the_constructor(spark_local):
    with pytest.raises(RuntimeError, match="'spark.task.resource.gpu.amount' was unset"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)


# -- Databricks' @distributed ----------------------------------------------------------------------------------
def test_the_distributed_decorator_returns_every_ranks_value_and_names_what_spark_ignores(spark_local):
    from spark_dist import ConfigError, distributed

    with pytest.warns(UserWarning, match=r"gpu_type='A10' and remote=True do not apply on a Spark cluster"):
        @distributed(gpus=2, gpu_type="A10", remote=True)
        def allreduce_rank(scale):
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo")  # the torchrun variables are set, as on Databricks
            total = torch.tensor([float(dist.get_rank())])
            dist.all_reduce(total)
            return {"rank": dist.get_rank(), "total": total.item() * scale}

    assert allreduce_rank.distributed(10) == [{"rank": 0, "total": 10.0}, {"rank": 1, "total": 10.0}]
    assert allreduce_rank.__name__ == "allreduce_rank" and allreduce_rank.distributed.__name__ == "allreduce_rank"
    with pytest.raises(ConfigError, match="gpus must be a positive int"):
        distributed(gpus=0)
