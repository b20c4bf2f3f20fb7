"""Moving from PySpark's TorchDistributor is one changed import."""
import os

import pytest
import torch

from spark_dist import TorchDistributor  # was: from pyspark.ml.torch.distributor import TorchDistributor

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "databricks_train.py")


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


def test_defaults_match_pyspark_local_mode_with_gpus():
    d = TorchDistributor()
    assert d._args["local_mode"] is True and d._args["use_gpu"] is True and d._args["num_processes"] == 1
    # Without a GPU on the driver that is a configuration error naming the setting to change.
    from spark_dist import ConfigError

    if torch.cuda.device_count() == 0:
        with pytest.raises(ConfigError, match="use_gpu=False"):
            d.run(train, 1e-3, True)
