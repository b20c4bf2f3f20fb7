"""A warm SparkSession on a 2-worker standalone cluster on loopback, for benchmarks (reuses tests/clusters.py)."""
import contextlib
import json
import os
import sys
import tempfile

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from clusters import StandaloneCluster, install_gpu_script  # noqa: E402


@contextlib.contextmanager
def standalone_session(app_name: str):
    """Yield a SparkSession with 2 executors of 1 core each; stop the session and every JVM afterwards."""
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="spark_dist-bench-") as tmp:
        cluster = StandaloneCluster(tmp, install_gpu_script(tmp)).start()
        spark = None
        try:
            spark = (SparkSession.builder.master(cluster.master_url).appName(app_name)
                     .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.executor.memory", "1g").config("spark.cores.max", "2").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            sc = spark.sparkContext
            # Warm: both executors registered and a job has run on them.
            sc.parallelize(range(2), 2).map(lambda x: x).collect()
            yield spark
        finally:
            if spark is not None:
                spark.stop()
            cluster.stop()


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def save(path, figures) -> None:
    """A benchmark's figures as JSON at ``path`` (its ``--out``; nothing without one), as bench/report.py reads
    them."""
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)
