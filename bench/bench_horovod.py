"""spark_dist's Horovod backend against ``horovod.spark.run``, and Horovod against DDP-gloo (a script, not a test).

    python bench/bench_horovod.py [--warm 5] [--mb 100] [--iters 5] [--out results.json] [--watch-listeners]

On a 2-worker standalone cluster (1 core each, loopback only; tests/clusters.py starts and stops it):

  1. Launch cost of a trivial job (2 ranks, ``hvd.init()`` and one all-reduce of 10 floats), warm session:
     spark_dist ``Distributor(2, backend="horovod")`` vs ``horovod.spark.run(fn, num_proc=2)``: the first
     run, then the median of ``--warm`` runs. Each launcher gets its own fresh application (new executors,
     one warm-up barrier job), so neither inherits Python workers the other warmed.
  2. All-reduce bandwidth of a ``--mb`` MB float32 tensor on 2 ranks, all via spark_dist: Horovod, its API on
     torch.distributed (``spark_dist.horovod``: goal >= Horovod's, issue #58) and DDP
     over gloo. Median time of ``--iters`` all-reduces (after one untimed), as MB/s (MB = 10^6 bytes).

Horovod's own services bind every interface (``find_port`` binds ``''``). For this script they are kept
on loopback: a ``sitecustomize`` on PYTHONPATH (driver, executors, Horovod's task processes) swaps in a
``find_port`` that binds 127.0.0.1. ``--watch-listeners`` samples the listening sockets of every process
this script started and reports any that are not on loopback.

Prints markdown tables; ``--out FILE`` also writes the figures as JSON.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

LOOPBACK_SITECUSTOMIZE = '''\
# Written by bench/bench_horovod.py: Horovod's services bind every interface; keep them on loopback.
try:
    import horovod.runner.util.network as _network
except Exception:
    pass
else:
    def _find_port_on_loopback(server_factory):
        server = server_factory(("127.0.0.1", 0))
        return server, server.server_address[1]

    _network.find_port = _find_port_on_loopback
'''


# -- what the ranks run (module-level: pickled by value from __main__) --------------------------------------
def trivial_hvd():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return float(hvd.allreduce(torch.ones(10), op=hvd.Sum, name="trivial")[0])


def bandwidth_hvd(mb, iters):
    import horovod.torch as hvd
    import torch

    hvd.init()
    t = torch.ones(int(mb * 1e6) // 4)
    hvd.allreduce_(t, op=hvd.Sum, name="bw")  # untimed: connections, buffers
    times = []
    for _ in range(iters):
        t.fill_(1.0)
        hvd.barrier()
        start = time.perf_counter()
        hvd.allreduce_(t, op=hvd.Sum, name="bw")
        times.append(time.perf_counter() - start)
    assert float(t[0]) == float(t[-1]) == hvd.size()
    return times


def bandwidth_ddp(mb, iters):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(int(mb * 1e6) // 4)
    dist.all_reduce(t)
    times = []
    for _ in range(iters):
        t.fill_(1.0)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - start)
    assert float(t[0]) == float(t[-1]) == dist.get_world_size()
    dist.destroy_process_group()
    return times


# -- measurements ---------------------------------------------------------------------------------------------
def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def launch_figures(run_once, warm):
    first, out = timed(run_once)
    assert out == 2.0, out  # ones summed over 2 ranks: the job really ran
    warm_times = [timed(run_once)[0] for _ in range(warm)]
    return {"first_s": first, "warm_median_s": statistics.median(warm_times), "warm_s": warm_times}


class ListenerWatch(threading.Thread):
    """Samples the listening TCP sockets of this process's descendants; keeps those not on loopback."""

    LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")

    def __init__(self, interval=0.5):
        super().__init__(daemon=True)
        self.interval, self.found, self.samples = interval, set(), 0
        self._stop_event = threading.Event()

    def run(self):
        import psutil

        me = psutil.Process()
        while not self._stop_event.wait(self.interval):
            ours = {p.pid for p in me.children(recursive=True)} | {me.pid}
            for c in psutil.net_connections("inet"):
                if c.status == psutil.CONN_LISTEN and c.pid in ours and c.laddr.ip not in self.LOOPBACK:
                    try:
                        name = " ".join(psutil.Process(c.pid).cmdline())[:120]
                    except psutil.Error:
                        name = "?"
                    self.found.add(f"{c.laddr.ip}:{c.laddr.port} pid {c.pid} {name}")
            self.samples += 1

    def stop(self):
        self._stop_event.set()
        self.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", type=int, default=5, help="warm runs per launcher (median reported)")
    parser.add_argument("--mb", type=float, default=100.0, help="all-reduce tensor size in MB (10^6 bytes)")
    parser.add_argument("--iters", type=int, default=5, help="timed all-reduces per backend")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--watch-listeners", action="store_true",
                        help="report listening sockets of our processes that are not on loopback")
    args = parser.parse_args()

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    patch_dir = tempfile.mkdtemp(prefix="bench_horovod-site-")
    with open(os.path.join(patch_dir, "sitecustomize.py"), "w") as f:
        f.write(LOOPBACK_SITECUSTOMIZE)
    # Executors and their Python workers inherit the worker JVMs' environment, Horovod's task processes ours.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [patch_dir, ROOT, os.environ.get("PYTHONPATH")] if p)
    sys.path.insert(0, patch_dir)
    import sitecustomize  # noqa: F401  (this interpreter started before the file existed)

    import horovod.spark

    from clusters import STANDALONE, SparkManager
    from spark_dist import Distributor
    from spark_dist.config import CONF_HOROVOD_IMPL

    watch = ListenerWatch() if args.watch_listeners else None
    if watch:
        watch.start()
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_horovod-") as tmp:
        manager = SparkManager(tmp)
        try:
            t0 = time.perf_counter()
            manager.get(STANDALONE)
            results["cluster_start_s"] = time.perf_counter() - t0
            results["spark_dist_horovod"] = launch_figures(
                lambda: Distributor(2, backend="horovod", verbose=False).run(trivial_hvd), args.warm)
            spark = manager.get(STANDALONE)
            for name, fn, backend, impl in (("horovod", bandwidth_hvd, "horovod", "horovod"),
                                            ("horovod_torch", bandwidth_hvd, "horovod", "torch"),
                                            ("ddp_gloo", bandwidth_ddp, "ddp", None)):
                if impl is not None:  # Horovod itself, or its API on torch.distributed (spark_dist.horovod)
                    spark.conf.set(CONF_HOROVOD_IMPL, impl)
                try:
                    times = Distributor(2, backend=backend, verbose=False).run(fn, args.mb, args.iters)
                finally:
                    spark.conf.unset(CONF_HOROVOD_IMPL)
                median = statistics.median(times)
                results[f"allreduce_{name}"] = {"mb": args.mb, "median_s": median, "times_s": times,
                                                "mb_per_s": args.mb / median}
            # Issue #58: spark_dist.horovod's bandwidth at least Horovod's own.
            results["allreduce_torch_vs_horovod"] = (results["allreduce_horovod_torch"]["mb_per_s"]
                                                     / results["allreduce_horovod"]["mb_per_s"])

            manager.stop()  # a fresh application for horovod.spark.run: cold executors, one warm-up job
            manager.get(STANDALONE)
            results["horovod_spark_run"] = launch_figures(
                lambda: horovod.spark.run(trivial_hvd, num_proc=2, use_gloo=True, verbose=0)[0], args.warm)
        finally:
            manager.shutdown()
            if watch:
                watch.stop()
            shutil.rmtree(patch_dir, ignore_errors=True)
    results["ratio_first"] = results["horovod_spark_run"]["first_s"] / results["spark_dist_horovod"]["first_s"]
    results["ratio_warm"] = (results["horovod_spark_run"]["warm_median_s"]
                             / results["spark_dist_horovod"]["warm_median_s"])
    results["environment"] = {
        "python": platform.python_version(), "cpus": os.cpu_count(), "load_before": load_before,
        "load_after": os.getloadavg(), "warm_runs": args.warm, "iters": args.iters,
    }
    if watch:
        results["non_loopback_listeners"] = sorted(watch.found)
        results["listener_samples"] = watch.samples

    sd, hs = results["spark_dist_horovod"], results["horovod_spark_run"]
    print("\nTrivial job: 2 ranks, hvd.init() + one all-reduce of 10 floats, standalone cluster, warm session\n")
    print(f"| launcher | first run | warm run (median of {args.warm}) |")
    print("|---|---|---|")
    print(f"| spark_dist `Distributor(2, backend=\"horovod\")` | {sd['first_s']:.2f} s | {sd['warm_median_s']:.2f} s |")
    print(f"| `horovod.spark.run(fn, num_proc=2)` | {hs['first_s']:.2f} s | {hs['warm_median_s']:.2f} s |")
    print(f"| ratio (horovod.spark.run / spark_dist) | {results['ratio_first']:.1f}x | {results['ratio_warm']:.1f}x |")
    print(f"\nAll-reduce of a {args.mb:g} MB float32 tensor, 2 ranks, via spark_dist (median of {args.iters})\n")
    print("| backend | time per all-reduce | bandwidth |")
    print("|---|---|---|")
    for label, key in (("Horovod (gloo)", "allreduce_horovod"), ("spark_dist.horovod", "allreduce_horovod_torch"),
                       ("DDP (gloo)", "allreduce_ddp_gloo")):
        r = results[key]
        print(f"| {label} | {r['median_s'] * 1000:.0f} ms | {r['mb_per_s']:.0f} MB/s |")
    print(f"\nload average before {load_before[0]:.1f}, after {results['environment']['load_after'][0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    if watch:
        print(f"non-loopback listeners seen in {watch.samples} samples: {sorted(watch.found) or 'none'}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
