"""Launch benchmark: spark_dist vs PySpark's TorchDistributor on the same standalone cluster, same run.

Trivial job: 2 ranks, one gloo all-reduce of 10 floats, warm SparkSession. Reports each launcher's first
run and the median of its warm runs, and their ratio. ``make bench-launch`` (never a timed test).

Floors, in the same run: the bare barrier stage (an RDD's, 2 tasks that return at once) and the bare barrier
``mapInArrow`` stage, spark_dist's own launch path (classic sessions and Connect alike), each warm. The first
run's ceiling is measured in a process of its own (its own driver JVM), on a cluster of its own: the
session's first barrier ``mapInArrow`` stage whose 2 tasks import torch and return, what any launcher on that
path pays before a rank runs (Spark's first SQL query and Arrow stage of the session, new Python workers,
their first ``import torch``).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

from _cluster import median, standalone_session


def allreduce_ten_floats():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(10)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t[0])


def timed(fn, runs):
    seconds, results = [], []
    for _ in range(runs):
        started = time.perf_counter()
        results.append(fn())
        seconds.append(time.perf_counter() - started)
    return seconds, results


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--ceiling", action="store_true", help="only the first run's ceiling, printed as JSON")
    args = parser.parse_args()

    if args.ceiling:
        with standalone_session("bench_launch_ceiling") as spark:
            seconds, _ = timed(lambda: arrow_stage(spark, import_torch=True), 1)
        print(json.dumps({"first": seconds[0]}))
        return
    # The ceiling in a process of its own: its driver JVM as cold as the one spark_dist's first run meets below.
    ceiling = subprocess.run([sys.executable, os.path.abspath(__file__), "--ceiling"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    figures = {FIRST_RUN_CEILING: json.loads(ceiling.strip().splitlines()[-1])}
    with standalone_session("bench_launch") as spark:
        sc = spark.sparkContext
        bare, _ = timed(lambda: sc.parallelize(range(2), 2).barrier().mapPartitions(lambda it: [1]).collect(),
                        args.warm_runs)
        figures["bare barrier stage (no sync)"] = {"first": bare[0], "warm_median": median(bare[1:])}
        figures.update(launchers_side_by_side(allreduce_ten_floats, args.warm_runs))
        arrow, _ = timed(lambda: arrow_stage(spark, import_torch=False), args.warm_runs)  # warm by now
        figures[ARROW_FLOOR] = {"warm_median": median(arrow)}
    report_side_by_side(figures, "launcher", args.out)


FIRST_RUN_CEILING = "first barrier mapInArrow stage importing torch (a process of its own)"
ARROW_FLOOR = "bare barrier mapInArrow stage"


def arrow_stage(spark, import_torch: bool) -> int:
    """A barrier ``mapInArrow`` stage of 2 tasks that return their rows (after ``import torch``)."""
    def task(batches):
        if import_torch:
            import torch  # noqa: F401 -- what a first run's ranks need before anything else
        yield from batches
    return spark.range(0, 2, 1, 2).mapInArrow(task, "id long", barrier=True).count()


def launchers_side_by_side(job, warm_runs):
    """The figures of spark_dist's Distributor and PySpark's TorchDistributor running ``job`` (2 ranks, its
    result 2.0) on the active session: the first run, then ``warm_runs`` more."""
    from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor

    from spark_dist import Distributor

    figures = {}
    for name, launcher in (("spark_dist Distributor", Distributor(num_processes=2, verbose=False)),
                           ("PySpark TorchDistributor",
                            PySparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False))):
        seconds, results = timed(lambda: launcher.run(job), warm_runs + 1)
        assert all(r == 2.0 for r in results), results
        figures[name] = {"first": seconds[0], "warm_median": median(seconds[1:]), "warm_runs": seconds[1:]}
    return figures


def report_side_by_side(figures, title, out):
    """Print the table and the TorchDistributor / spark_dist ratios; write them as JSON to ``out``."""
    ours, theirs = figures["spark_dist Distributor"], figures["PySpark TorchDistributor"]
    ratios = {"first": theirs["first"] / ours["first"], "warm_median": theirs["warm_median"] / ours["warm_median"]}
    print(f"| {title} | first run (s) | warm median (s) |\n|---|---|---|")
    for name, f in figures.items():
        first, warm = (f"{f[k]:.3f}" if k in f else "-" for k in ("first", "warm_median"))
        print(f"| {name} | {first} | {warm} |")
    print(f"| TorchDistributor / spark_dist | {ratios['first']:.1f}x | {ratios['warm_median']:.1f}x |")
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"figures": figures, "ratios": ratios, "machine": platform.platform(),
                       "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M")}, f, indent=2)


if __name__ == "__main__":
    main()
