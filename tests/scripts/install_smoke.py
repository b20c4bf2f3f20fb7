"""What a user runs right after ``pip install spark_dist``: a 2-rank DDP run reading a DataFrame.

    python install_smoke.py      prints one JSON line: versions, where spark_dist came from, each rank's rows

Loopback only (spark.driver.host=127.0.0.1); the SparkSession is stopped before it exits.
"""
import json
import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def count_my_rows():
    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    labels = torch.cat([batch["label"] for batch in ctx.loader("train", batch_size=10, epoch=0)])
    per_rank = [None] * ctx.world_size
    dist.all_gather_object(per_rank, sorted(labels.tolist()))
    dist.destroy_process_group()
    return per_rank


def workers_modules():
    """Where a Python worker's daemon (the module it was forked from runs as ``__main__``), PySpark and spark_dist
    came from."""
    import sys

    import pyspark

    import spark_dist

    return {"daemon": sys.modules["__main__"].__file__, "pyspark": pyspark.__file__, "spark_dist": spark_dist.__file__}


def main():
    import numpy
    import pandas
    import pyarrow
    import pyspark
    from pyspark.sql import SparkSession, functions as F

    import spark_dist
    from spark_dist import Distributor

    # PySpark's daemon as the wheel's spark_dist_daemon (README, "Faster Python workers").
    spark = (SparkSession.builder.master("local[2]").appName("install_smoke")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.python.daemon.module", "spark_dist_daemon").getOrCreate())
    try:
        df = spark.range(100).select(F.array(F.col("id").cast("float"), F.lit(1.0)).alias("x"),
                                     F.col("id").alias("label"))
        per_rank = Distributor(num_processes=2).run(count_my_rows, datasets={"train": df})
        workers = spark.sparkContext.parallelize([0], 1).map(lambda _: workers_modules()).collect()[0]
    finally:
        spark.stop()
    print(json.dumps({"versions": {m.__name__: m.__version__ for m in (pyspark, numpy, pyarrow, pandas)},
                      "spark_dist_file": spark_dist.__file__, "per_rank": per_rank, "workers": workers}))


if __name__ == "__main__":
    main()
