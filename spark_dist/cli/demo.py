"""The main job: 2-rank DDP training of a small MLP on scikit-learn's handwritten digits, read from a Spark
DataFrame through spark_dist's loaders, on local Spark. ``python -m spark_dist.cli.demo`` (``make demo``)."""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings


def train(epochs: int, lr: float, batch_size: int):
    """Runs on every rank: DDP over gloo, each rank reading its equal shard of "train"."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from spark_dist import get_context

    ctx = get_context()
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        total, count = torch.zeros(1), torch.zeros(1)
        for batch in ctx.loader("train", batch_size=batch_size, epoch=epoch):
            optimizer.zero_grad()
            loss = loss_fn(model(batch["features"] / 16.0), batch["label"])
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(batch["label"])
            count += len(batch["label"])
        dist.all_reduce(total)
        dist.all_reduce(count)
        if ctx.rank == 0 and (epoch % 5 == 4 or epoch == epochs - 1):
            ctx.report(epoch=epoch, train_loss=float(total / count))
    dist.destroy_process_group()
    return {k: v.cpu() for k, v in model.module.state_dict().items()}


def digits_frames(spark, seed: int = 42):
    """The digits set (1,797 8x8 images) as train and held-out DataFrames of (features array<float>, label)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = [(list(map(float, x)), int(y)) for x, y in zip(digits.data, digits.target)]
    df = spark.createDataFrame(rows, "features array<float>, label long")
    return df.randomSplit([0.8, 0.2], seed=seed)


def held_out_accuracy(state_dict, val_df) -> float:
    import numpy as np
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model.load_state_dict(state_dict)
    pdf = val_df.toPandas()
    x = torch.tensor(np.stack(pdf["features"].to_numpy()), dtype=torch.float32) / 16.0
    with torch.no_grad():
        predicted = model(x).argmax(dim=1).numpy()
    return float((predicted == pdf["label"].to_numpy()).mean())


def main(argv=None) -> int:
    # pyspark 4.3 on pandas 3 (the Spark 4 line's pin) prints a blanket notice on every pandas conversion.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_dist import Distributor

    from spark_dist.spark import python_daemon

    builder = (SparkSession.builder.master(args.master).appName("spark_dist digits demo")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    # The demo's own session: PySpark without Spark's zip where the workers run this Python (docs/speedups.md).
    daemon = python_daemon.conf_default({"spark.master": args.master}, os.environ["PYSPARK_PYTHON"])
    if daemon:
        builder = builder.config(python_daemon.KEY, daemon)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        train_df, val_df = digits_frames(spark)
        started = time.time()
        state = Distributor(num_processes=args.num_processes).run(
            train, args.epochs, args.lr, args.batch_size, datasets={"train": train_df})
        seconds = time.time() - started
        accuracy = held_out_accuracy(state, val_df)
        print(f"digits: {args.num_processes}-rank DDP on {args.master}, {args.epochs} epochs, "
              f"{train_df.count()} training rows: held-out accuracy {accuracy:.3f} ({val_df.count()} rows), "
              f"training {seconds:.1f}s")
        return 0 if accuracy > 0.9 else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
