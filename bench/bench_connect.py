"""Launch through Spark Connect: spark_dist vs PySpark's TorchDistributor through the same server, same run.

A Connect server (tests/connect_server.py) drives a 2-worker standalone cluster on loopback; this process is
a plain Connect client (``SparkSession.builder.remote``, no JVM here). Trivial job: 2 ranks, one gloo
all-reduce of 10 floats. Reports each launcher's first run and the median of its warm runs, and their
ratio (goal: >= 10x). ``make bench-connect``; on the 3.5 line, which has no Connect server, it says so.
"""
import argparse
import json
import tempfile

from _cluster import median  # also puts tests/ on sys.path and sets SPARK_LOCAL_IP

from bench_launch import ARROW_FLOOR, arrow_stage, launchers_side_by_side, report_side_by_side, timed
from clusters import StandaloneCluster, connect_available, install_gpu_script


def allreduce_ten_floats():  # defined here: __main__ is pickled by value, a module on this path is not
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(10)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    reason = connect_available()
    if reason:
        print(f"skipped: {reason}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"skipped": reason}, f)
        return

    from pyspark.sql import SparkSession

    from connect_server import ConnectServer

    figures = {}
    with tempfile.TemporaryDirectory(prefix="spark_dist-bench-") as tmp:
        cluster = StandaloneCluster(tmp, install_gpu_script(tmp)).start()
        server = None
        try:
            server = ConnectServer(tmp, cluster.master_url, conf={"spark.cores.max": "2"}).start()
            spark = SparkSession.builder.remote(server.url).getOrCreate()  # as a user's notebook does

            # also waits the executors in
            seconds, _ = timed(lambda: arrow_stage(spark, import_torch=False), args.warm_runs + 1)
            figures[ARROW_FLOOR] = {"first": seconds[0], "warm_median": median(seconds[1:])}
            figures.update(launchers_side_by_side(allreduce_ten_floats, args.warm_runs))
            spark.stop()
        finally:
            if server is not None:
                server.stop()
            cluster.stop()

    report_side_by_side(figures, "launcher (through Spark Connect)", args.out)


if __name__ == "__main__":
    main()
