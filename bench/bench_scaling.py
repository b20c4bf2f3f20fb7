"""Scaling with data: cache write and one epoch of loading, per row, as the dataset grows (a script, not a test).

    python bench/bench_scaling.py [--sizes 500000,1000000,2000000,5000000,8000000] [--repeat 1] [--out FILE] [--plot FILE.png]

Data: for each size, ``rows`` rows of a 32-float array column ``features`` and a long ``label`` (bench_data's
"issue" dataset: 136 bytes a row), on ``local[2]``, ``.cache()``d and counted first so that
generating it is not timed. Then, for each size:

  (a) cache write: ``prepare_datasets(spark, {name: df}, 1)`` (spark_dist's Petastorm cache: uncompressed,
      8 MiB row groups, the value checks measured in the same job)
  (b) plain write, the anchor: ``df.write.parquet(tmpdir)`` of the same cached DataFrame, Spark's defaults
      (snappy); the goal is (a) <= 1.25x (b)
  (c) one epoch of ``make_loader(handle, rank=0, world_size=1, batch_size=1024)`` (shuffled, the default),
      with the peak growth of this process's memory during it: VmRSS (which counts the memory-mapped cache
      pages the reader touched) and RssAnon (the heap alone), sampled every few ms from /proc/self/status;
      the goal is < 256 MiB for a 5M-row dataset
  (d) bench_data's pyarrow ``iter_batches -> torch.from_numpy`` reader over the same files: the ceiling

A small dataset (``--warmup-rows``) goes through all four first, unreported, so the smallest size is not charged
for the JVM's and the readers' first run. With ``--repeat N`` each figure is the best of N runs (the two writes
alternate their order; each cache write after the first runs after ``clear_cache``). Caches, plain copies and
the cached DataFrame are deleted before the next size, so disk use stays at about two copies of the largest.

Goal: time per row does not grow with size. Prints markdown tables (seconds, microseconds per row, rows/s, and
microseconds per row relative to the smallest size); ``--out FILE`` also writes the figures as JSON, and
``--plot FILE`` a PNG of microseconds per row against rows (default: next to ``--out``, else
``bench/results/scaling-spark<line>.png``).
"""
import argparse
import ctypes
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

from bench_data import BATCH, build_dataset, read_ours, read_pyarrow  # noqa: E402 -- after the path is set

MIB = 1 << 20
SERIES = (("write", "cache write (prepare_datasets)"), ("plain", "plain df.write.parquet"),
          ("loader", "make_loader epoch"), ("ceiling", "pyarrow ceiling"))


def spark_line() -> str:
    """The Spark line as the Makefile names it: ``4`` for any 4.x, ``3.5`` for 3.5.x."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return major if int(major) >= 4 else f"{major}.{minor}"


# -- memory ----------------------------------------------------------------------------------------------------
def _memory_kib() -> dict:
    """This process's VmRSS and RssAnon in KiB (Linux); elsewhere psutil's RSS for both."""
    try:
        with open("/proc/self/status") as f:
            found = {}
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon"):
                    found[key] = int(line.split()[1])
            if len(found) == 2:
                return found
    except OSError:
        pass
    import psutil

    rss = psutil.Process().memory_info().rss // 1024
    return {"VmRSS": rss, "RssAnon": rss}


def _release_memory() -> None:
    """Hand freed memory back to the OS before a baseline, so that memory kept from earlier sizes does not
    hide the growth of the next run (glibc's arenas, pyarrow's mimalloc pool)."""
    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Samples this process's memory in a thread while the ``with`` block runs; ``growth_mib`` holds the peak
    above the value just before it, for VmRSS and RssAnon."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.growth_mib = {}

    def __enter__(self):
        _release_memory()
        self._base = _memory_kib()
        self._peak = dict(self._base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="bench_scaling-memory")
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def _take(self) -> None:
        for key, value in _memory_kib().items():
            self._peak[key] = max(self._peak[key], value)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._take()
        self.growth_mib = {key: (self._peak[key] - self._base[key]) / 1024 for key in self._base}
        return False


# -- one size --------------------------------------------------------------------------------------------------
def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _warm_page_cache(paths) -> None:
    """Read the files once so that neither reader is charged for the disk (the machine has the RAM)."""
    buf = bytearray(8 * MIB)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _best(old, new):
    return new if old is None else min(old, new)


def measure_size(spark, rows: int, repeat: int, scratch: str) -> dict:
    from spark_dist.data import clear_cache, prepare_datasets
    from spark_dist.data.urls import local_path

    df = build_dataset(spark, rows, wide=False).cache()
    try:
        df.count()  # materialises the cache: generating the rows is not timed
        r = {"rows": rows}
        handle = None
        for round_ in range(repeat):
            plain_dir = os.path.join(scratch, f"plain-{rows}-{round_}")

            def cache_write():
                nonlocal handle
                if handle is not None:
                    clear_cache(spark)  # else prepare_datasets reuses the cache (same plan): no write to time
                t0 = time.perf_counter()
                handle = prepare_datasets(spark, {f"scaling{rows}": df}, 1)[f"scaling{rows}"]
                r["write_s"] = _best(r.get("write_s"), time.perf_counter() - t0)

            def plain_write():
                t0 = time.perf_counter()
                df.write.parquet(plain_dir)
                r["plain_s"] = _best(r.get("plain_s"), time.perf_counter() - t0)
                r["plain_mib"] = _dir_bytes(plain_dir) / MIB
                shutil.rmtree(plain_dir)

            for step in ((cache_write, plain_write) if round_ % 2 == 0 else (plain_write, cache_write)):
                step()

        files = [local_path(u) for u in handle.file_urls]
        r["cache_mib"] = sum(os.path.getsize(p) for p in files) / MIB
        r["files"] = len(files)
        r["row_groups"] = sum(map(len, handle.row_group_rows))
        _warm_page_cache(files)
        for _ in range(repeat):
            with PeakMemory() as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                got = read_ours(handle, True)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            r["loader_rows"] = got
            r["loader_s"], r["loader_cpu_s"] = _best(r.get("loader_s"), wall), _best(r.get("loader_cpu_s"), cpu)
            r["loader_rss_mib"] = max(r.get("loader_rss_mib", 0.0), mem.growth_mib["VmRSS"])
            r["loader_anon_mib"] = max(r.get("loader_anon_mib", 0.0), mem.growth_mib["RssAnon"])

            with PeakMemory() as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                got = read_pyarrow(handle)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            r["ceiling_rows"] = got
            r["ceiling_s"] = _best(r.get("ceiling_s"), wall)
            r["ceiling_cpu_s"] = _best(r.get("ceiling_cpu_s"), cpu)
            r["ceiling_rss_mib"] = max(r.get("ceiling_rss_mib", 0.0), mem.growth_mib["VmRSS"])
            r["ceiling_anon_mib"] = max(r.get("ceiling_anon_mib", 0.0), mem.growth_mib["RssAnon"])
        del handle
    finally:
        clear_cache(spark)
        df.unpersist(blocking=True)
    for key, _ in SERIES:
        n = r.get(f"{key}_rows", rows)  # the loader drops the last partial batch (drop_last=True)
        r[f"{key}_us_per_row"] = r[f"{key}_s"] / n * 1e6
        r[f"{key}_rows_per_s"] = n / r[f"{key}_s"]
    r["write_vs_plain"] = r["write_s"] / r["plain_s"]
    r["loader_of_ceiling"] = r["ceiling_s"] / r["loader_s"] * r["loader_rows"] / r["ceiling_rows"]
    return r


# -- output ----------------------------------------------------------------------------------------------------
def print_tables(results: list) -> None:
    first = results[0]
    print("\nWrites (the cached DataFrame to Parquet; generating it is not timed)\n")
    print("| rows | cache write s | µs/row | rows/s | plain write s | µs/row | rows/s | write / plain "
          "| cache MiB | plain MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']:,} | {r['write_s']:.2f} | {r['write_us_per_row']:.2f} | {r['write_rows_per_s']:,.0f} "
              f"| {r['plain_s']:.2f} | {r['plain_us_per_row']:.2f} | {r['plain_rows_per_s']:,.0f} "
              f"| {r['write_vs_plain']:.2f}x | {r['cache_mib']:,.0f} | {r['plain_mib']:,.0f} |")
    print(f"\nOne epoch, batch_size={BATCH} (the loader shuffled; memory: peak growth of this process during it)\n")
    print("| rows | files / row groups | loader s | µs/row | rows/s | ceiling s | µs/row | rows/s | of ceiling "
          "| loader VmRSS MiB | loader RssAnon MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']:,} | {r['files']} / {r['row_groups']} | {r['loader_s']:.2f} "
              f"| {r['loader_us_per_row']:.3f} | {r['loader_rows_per_s']:,.0f} | {r['ceiling_s']:.2f} "
              f"| {r['ceiling_us_per_row']:.3f} | {r['ceiling_rows_per_s']:,.0f} | {r['loader_of_ceiling']:.0%} "
              f"| {r['loader_rss_mib']:,.0f} | {r['loader_anon_mib']:,.0f} |")
    print(f"\nµs per row relative to {first['rows']:,} rows (the goal: not above 1.00x as rows grow)\n")
    print("| rows | " + " | ".join(label for _, label in SERIES) + " |")
    print("|---:|" + "---:|" * len(SERIES))
    for r in results:
        print(f"| {r['rows']:,} | " + " | ".join(
            f"{r[f'{key}_us_per_row'] / first[f'{key}_us_per_row']:.2f}x" for key, _ in SERIES) + " |")


def plot(results: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r["rows"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = ((axes[0], "writes", SERIES[:2], "os"), (axes[1], f"one epoch, batch_size={BATCH}", SERIES[2:], "D^"))
    for ax, name, series, markers in panels:
        for (key, label), marker in zip(series, markers):
            ax.plot(rows, [r[f"{key}_us_per_row"] for r in results], marker=marker, label=label)
        ax.set_xscale("log")
        ax.set_xticks(rows)
        ax.set_xticklabels([f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" for n in rows])
        ax.minorticks_off()
        ax.set_ylim(bottom=0, top=max(r[f"{key}_us_per_row"] for r in results for key, _ in series) * 1.15)
        ax.set_xlabel("rows (log scale)")
        ax.set_ylabel("µs per row")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500000,1000000,2000000,5000000,8000000", help="rows, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measure per size; the best counts")
    parser.add_argument("--warmup-rows", type=int, default=100_000, help="rows of the unreported first run")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--plot", help="write the PNG here (default: next to --out, else bench/results/)")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip())
    if not sizes or sizes[0] < BATCH or args.repeat < 1:
        parser.error(f"--sizes needs at least one size of >= {BATCH} rows, --repeat >= 1")

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # petastorm on pyarrow 14: deprecation noise
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # (d): read-only views
    import pyspark
    from pyspark.sql import SparkSession

    line = spark_line()
    plot_path = None if args.no_plot else (
        args.plot or (os.path.splitext(args.out)[0] + ".png" if args.out
                      else os.path.join(BENCH, "results", f"scaling-spark{line}.png")))

    spark = (SparkSession.builder.master("local[2]").appName("bench_scaling")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", args.driver_memory)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    scratch = tempfile.mkdtemp(prefix="bench_scaling-")
    results = []
    try:
        t0 = time.perf_counter()
        if args.warmup_rows >= BATCH:
            measure_size(spark, args.warmup_rows, 1, scratch)
        warmup_s = time.perf_counter() - t0
        for rows in sizes:
            t0 = time.perf_counter()
            results.append(measure_size(spark, rows, args.repeat, scratch))
            print(f"{rows:,} rows measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()

    print(f"\n{', '.join(f'{n:,}' for n in sizes)} rows (32-float array, long label; 136 bytes a row) on local[2], "
          f"Spark {pyspark.__version__}; best of {args.repeat}; warm-up ({args.warmup_rows:,} rows) {warmup_s:.0f} s")
    print_tables(results)
    growth = {key: results[-1][f"{key}_us_per_row"] / results[0][f"{key}_us_per_row"] for key, _ in SERIES}
    report = {"sizes": sizes, "batch_size": BATCH, "repeat": args.repeat, "spark": pyspark.__version__,
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "us_per_row_largest_vs_smallest": growth, "sizes_measured": results}
    if plot_path:
        plot(results, plot_path, f"Scaling with data (local[2], Spark {pyspark.__version__})")
        print(f"\nplot: {plot_path}")
        report["plot"] = os.path.relpath(plot_path, ROOT)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
