"""FSDP2 end to end (issue #41, item 2): tests/scripts/train_fsdp.py's model, sharded with ``fully_shard`` over
2 ranks, checkpointed sharded. A rank killed mid-epoch: the retry resumes from the last committed checkpoint and
ends with the weights of an uninterrupted run (as a function, and as a script through TorchDistributor under
Spark Connect); a run resumed on fewer ranks goes on with the same loss curve."""
import os
import sys

import pytest
import torch

from spark_dist import Distributor, TorchDistributor

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "train_fsdp.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
from train_fsdp import train  # noqa: E402

EPOCHS = 4  # 200 rows: 12 batches of 8 a rank and epoch on 2 ranks; a checkpoint every 5 and at each epoch's end
KILL_AT = (1, 7)  # rank 1 of the first attempt dies here, two batches after the checkpoint at (1, 5)


def regression(spark):
    return spark.range(0, 200, numPartitions=3).select(
        F.array(*[F.sin(F.col("id") * k) for k in (1, 2, 3, 4)]).alias("x"), F.cos(F.col("id")).alias("y"))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert tensor.equal(b[name]), name


def test_a_killed_rank_resumes_from_the_sharded_checkpoint_and_a_smaller_run_goes_on(spark_local, tmp_path):
    df = regression(spark_local)
    clean = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "clean"))
    expected = clean.run(train, EPOCHS, datasets={"train": df})
    assert expected["attempt"] == 0 and expected["resumed_at"] is None
    assert expected["losses"][EPOCHS - 1] < expected["losses"][0]
    assert clean.best_checkpoint.startswith(str(tmp_path / "clean"))  # a given directory keeps them

    killed = Distributor(num_processes=2, max_retries=1, verbose=False, checkpoint_dir=str(tmp_path / "killed"))
    out = killed.run(train, EPOCHS, kill_at=KILL_AT, async_save=True, datasets={"train": df})
    # Saved in the background: the save at (1, 5) may not be complete when rank 1 dies two batches later, and
    # then the one before it, at epoch 0's end, is the last committed. Either way nothing is trained twice.
    assert out["attempt"] == 1 and out["resumed_at"] in [(0, 12), (1, 5)]
    assert_same_weights(expected["weights"], out["weights"])

    # Two epochs on 2 ranks, then the same run resumed on 1 rank with the same global batch (16 rows a step).
    first = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "shrink"), run_id="shrink")
    first.run(train, 2, datasets={"train": df})
    second = Distributor(num_processes=1, verbose=False, checkpoint_dir=str(tmp_path / "shrink"), run_id="shrink")
    smaller = second.run(train, EPOCHS, batch_size=16, datasets={"train": df})
    assert smaller["world_size"] == 1 and smaller["resumed_at"] == (1, 12)  # epoch 1 done: epochs 2 and 3 left
    assert sorted(smaller["losses"]) == [2, 3]
    for epoch in (2, 3):  # another world size deals the rows out in another order: close, not equal
        assert smaller["losses"][epoch] == pytest.approx(expected["losses"][epoch], rel=0.25)


def test_a_script_through_torch_distributor_under_connect_resumes_exactly(spark_connect, tmp_path):
    df = regression(spark_connect)

    def run(name, *extra):
        out = str(tmp_path / f"{name}.pt")
        distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, max_retries=1,
                                       verbose=False, checkpoint_dir=str(tmp_path / name))
        assert distributor.run_with_datasets({"train": df}, SCRIPT, "--epochs", "2", "--out", out, *extra) is None
        return torch.load(out, weights_only=False)

    expected, out = run("clean"), run("killed", "--kill-at", *map(str, KILL_AT))
    assert (expected["attempt"], out["attempt"], out["resumed_at"]) == (0, 1, (1, 5))
    assert_same_weights(expected["weights"], out["weights"])
