"""A host lost mid-run, elastic against fixed size (``make bench-elastic``; root: two hosts in network namespaces).

The two-host cluster of the tests (tests/two_hosts.py: a standalone worker of 2 cores in each of two network
namespaces), 4 ranks, 2 on each host; 3 steps into the run host 10.213.0.3 is taken off the network.

- elastic: ``min_processes=2``: the run goes on with the 2 ranks of the host left;
- fixed: the same run at a fixed size with ``max_retries=1``: its retry waits for the host, which comes back
  60 s after it went.

The figure for each is the time from the host's loss to the first step of the next attempt (a rank's report);
a fresh cluster for each way. Goal (#44): elastic <= 0.3x fixed.
"""
import argparse
import os
import tempfile
import threading
import time

from _cluster import save  # sets the loopback address and puts tests/ on the path

import two_hosts  # noqa: E402 -- from tests/
from clusters import install_gpu_script  # noqa: E402

HOST_BACK_AFTER_S = 60.0


def steps(count, step_seconds):
    """``count`` all-reduce steps of 4 ranks, a rank-0 checkpoint after each; each step reported."""
    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    ctx = get_context()
    dist.init_process_group("gloo")
    state = ctx.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, count + 1):
        dist.all_reduce(torch.ones(1024))
        ctx.report(step=step, world=ctx.world_size)
        ctx.save_checkpoint({"step": step})
        time.sleep(step_seconds)
    dist.destroy_process_group()
    return ctx.world_size


def one_way(elastic: bool, tmp: str) -> dict:
    """A fresh two-host cluster, a run that loses a host: seconds from the loss to the next attempt's first step."""
    from pyspark.sql import SparkSession

    from spark_dist import Distributor

    cluster = two_hosts.TwoHostCluster(tmp, install_gpu_script(tmp)).start()
    spark = None
    try:
        spark = (SparkSession.builder.master(cluster.master_url).appName("bench_elastic")
                 .config("spark.driver.host", two_hosts.DRIVER_IP).config("spark.driver.bindAddress", two_hosts.DRIVER_IP)
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.executor.memory", "1g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.range(0, 4, 1, 4).mapInArrow(lambda b: b, "id long", barrier=True).collect()  # warm
        checkpoints = os.path.join(tmp, "checkpoints")
        os.makedirs(checkpoints, mode=0o700)
        d = Distributor(num_processes=4, min_processes=2 if elastic else None, max_retries=1,
                        checkpoint_dir=checkpoints, verbose=False, spark=spark)
        lost = {}

        def operator():
            while not any(r.get("step", 0) >= 3 for r in list(d.history)):
                time.sleep(0.02)
            lost["at"] = time.time()
            cluster.take_down(1)
            if not elastic:
                time.sleep(HOST_BACK_AFTER_S)
                cluster.bring_up(1)

        threading.Thread(target=operator, daemon=True).start()
        world = d.run(steps, 60 if elastic else 20, 0.2)
        again = min(r["time"] for r in d.history if r.get("attempt") == 1 and r.get("step"))
        return {"seconds_to_training_again": again - lost["at"], "world_size_after": world,
                "attempts": max(r["attempt"] for r in d.history if r.get("rank") is not None) + 1}
    finally:
        cluster.bring_up(1)  # else stopping Spark waits out its RPC timeouts for the unreachable executor
        if spark is not None:
            spark.stop()
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out")
    args = parser.parse_args()
    reason = two_hosts.available()
    if reason:  # recorded, so that `make bench` goes on and the page says why the figure is missing
        print(f"bench_elastic skipped: two hosts in network namespaces: {reason}")
        save(args.out, {"skipped": reason})
        return
    load_before = os.getloadavg()[0]
    figures = {}
    for way, elastic in (("elastic", True), ("fixed", False)):
        with tempfile.TemporaryDirectory(prefix=f"spark_dist-bench-{way}-") as tmp:
            figures[way] = one_way(elastic, tmp)
        print(f"{way}: {figures[way]}", flush=True)
    figures["ratio"] = figures["elastic"]["seconds_to_training_again"] / figures["fixed"]["seconds_to_training_again"]
    figures["host_back_after_s"] = HOST_BACK_AFTER_S
    figures["load_average"] = [load_before, os.getloadavg()[0]]
    print(f"elastic / fixed: {figures['ratio']:.2f}x")
    save(args.out, figures)


if __name__ == "__main__":
    main()
