"""The frameworks people train with, through the drop-in and through Distributor, on local[2] and on the
standalone cluster: Lightning's multi-node DDP recipe, Hugging Face's Trainer, and a torchrun script from
pytorch/examples beside real torchrun."""
import contextlib
import io
import os
import sys

import torch

from clusters import free_port
from spark_dist import Distributor, TorchDistributor, get_context
from commands import BIN, SCRIPTS, assert_only_aborted_on_the_way_out, run_command


def run_captured(call):
    """``call()``'s result and what reached the driver's stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = call()
    return result, out.getvalue() + err.getvalue()


# -- Lightning ----------------------------------------------------------------------------------------------
def lightning_module():
    import lightning.pytorch as pl

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

        def training_step(self, batch, _):
            x, y = (batch["features"] / 16.0, batch["label"]) if isinstance(batch, dict) else batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return Classifier()


def lightning_outcome(trainer, model):
    weights = model.net[0].weight.detach()
    return {"world_size": trainer.world_size, "num_nodes": trainer.num_nodes, "global_rank": trainer.global_rank,
            "loss": float(trainer.callback_metrics["train_loss"]), "weights": weights}


def lightning_recipe(num_proc, root):
    """PySpark's documented Lightning recipe (multi-node: devices=1, num_nodes=num_processes), on the CPU."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randint(0, 17, (512, 64)).float(), torch.randint(0, 10, (512,)))
    model = lightning_module()
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=num_proc, strategy="ddp", max_epochs=2,
                         logger=False, enable_checkpointing=False, default_root_dir=root)
    trainer.fit(model, DataLoader(data, batch_size=32))
    return lightning_outcome(trainer, model)




def test_lightning_multi_node_recipe_through_the_drop_in_standalone(spark_standalone, tmp_path):
    check_lightning_recipe_through_the_drop_in(tmp_path)


def check_lightning_recipe_through_the_drop_in(tmp_path):
    result, shown = run_captured(lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        lightning_recipe, 2, str(tmp_path)))
    assert (result["world_size"], result["num_nodes"], result["global_rank"]) == (2, 2, 0)
    assert result["loss"] < 2.5
    # Lightning's own progress bar and log lines, relayed from rank 0 to the driver.
    assert "[rank 0] " in shown and "Epoch 1" in shown
    assert "[rank 0] GPU available: False" in shown


class EpochLoader:
    """Lightning re-iterates its train loader each epoch: each pass is the next epoch of ``ctx.loader``."""

    def __init__(self, batch_size):
        self.batch_size, self.epoch = batch_size, 0

    def __iter__(self):
        loader = get_context().loader("train", batch_size=self.batch_size, epoch=self.epoch)
        self.epoch += 1
        return iter(loader)


def lightning_on_spark_data(root):
    """One machine's recipe (devices=2, num_nodes=1) over spark_dist's per-rank shards."""
    import lightning.pytorch as pl

    torch.manual_seed(0)
    model = lightning_module()
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_epochs=3,
                         logger=False, enable_checkpointing=False, default_root_dir=root,
                         use_distributed_sampler=False)
    trainer.fit(model, EpochLoader(64))
    return lightning_outcome(trainer, model)




def test_lightning_through_distributor_reads_ctx_loader_standalone(spark_standalone, tmp_path):
    check_lightning_through_distributor(spark_standalone, tmp_path)


def check_lightning_through_distributor(spark, tmp_path):
    from spark_dist.cli.demo import digits_frames

    train_df, _ = digits_frames(spark)
    result, shown = run_captured(lambda: Distributor(num_processes=2).run(
        lightning_on_spark_data, str(tmp_path), datasets={"train": train_df}))
    assert (result["world_size"], result["num_nodes"]) == (2, 1)
    assert result["loss"] < 1.0  # the digits are easy: three epochs learn them
    assert "[rank 0] " in shown and "Epoch 2" in shown


# -- Hugging Face -------------------------------------------------------------------------------------------
def hf_trainer(root):
    """A tiny BERT built from a config (random init, nothing downloaded) trained by transformers' Trainer."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    ids = torch.randint(0, 64, (128, 8))
    data = [{"input_ids": row, "labels": int(row[0] % 2)} for row in ids]
    args = TrainingArguments(output_dir=root, max_steps=6, per_device_train_batch_size=8, use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=2, ddp_backend="gloo",
                             disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    metrics = trainer.train().metrics
    return {"world_size": args.world_size, "process_index": args.process_index, "metrics": metrics,
            "global_step": trainer.state.global_step}




def test_hugging_face_trainer_standalone(spark_standalone, tmp_path):
    check_hugging_face_trainer(tmp_path)


def check_hugging_face_trainer(tmp_path):
    """world size 2 seen by TrainingArguments; rank 0's metrics come back."""
    result = Distributor(num_processes=2, verbose=False).run(hf_trainer, str(tmp_path))
    assert (result["world_size"], result["process_index"], result["global_step"]) == (2, 0, 6)
    assert result["metrics"]["train_loss"] > 0 and "train_runtime" in result["metrics"]


# -- a torchrun script from pytorch/examples ----------------------------------------------------------------
MULTINODE = os.path.join(SCRIPTS, "multinode_cpu.py")


def test_pytorch_examples_multinode_script_matches_real_torchrun(tmp_path):
    """The same script and arguments under real torchrun and under `spark-dist run` on local[2]: the same
    final weights."""
    args = ["3", "1", "--batch_size", "64"]  # total_epochs, save_every: the snapshot after the last epoch
    env = {**os.environ, "SNAPSHOT_PATH": str(tmp_path / "torchrun.pt")}

    torchrun = run_command([os.path.join(BIN, "torchrun"), "--nnodes=1", "--nproc_per_node=2",
                            "--master_addr=127.0.0.1", f"--master_port={free_port()}", MULTINODE, *args],
                           cwd=tmp_path, env=env)
    if torchrun.returncode != 0:
        # torch's own gloo teardown can abort a rank under plain torchrun once the script is done (a rare race):
        # accepted only that way, and only once the last epoch's snapshot is on disk.
        assert os.path.exists(env["SNAPSHOT_PATH"]), torchrun.stderr[-3000:]
        assert torch.load(env["SNAPSHOT_PATH"])["EPOCHS_RUN"] == 2, torchrun.stderr[-3000:]
        assert_only_aborted_on_the_way_out(torchrun)
    env["SNAPSHOT_PATH"] = str(tmp_path / "spark_dist.pt")
    ours = run_command([sys.executable, "-m", "spark_dist", "run", "--master", "local[2]", "-n", "2",
                        MULTINODE, *args], cwd=tmp_path, env=env)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "[rank 1] [CPU1] Epoch 2 | Batchsize: 64 | Steps: 16" in ours.stdout
    expected, got = (torch.load(tmp_path / f"{name}.pt") for name in ("torchrun", "spark_dist"))
    assert expected["EPOCHS_RUN"] == got["EPOCHS_RUN"] == 2
    for key, tensor in expected["MODEL_STATE"].items():
        assert torch.equal(tensor, got["MODEL_STATE"][key]), key
