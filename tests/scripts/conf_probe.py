"""Start a SparkSession from a properties file (as --properties-file would) and report, as JSON on
stdout, what the JVM made of it. Used by tests/test_conf.py, one JVM for every check:

    python conf_probe.py SESSION_PROPERTIES LOG4J2_FILE [TEMPLATE ...]

- "conf": the session's conf entries that came from SESSION_PROPERTIES (as the session reports them);
- "barrier": the result of a barrier stage of one task per default-parallelism slot;
- "log4j": the configuration file log4j2 loaded and the levels it gives Spark's loggers;
- "unknown_keys": for each TEMPLATE, keys that Spark 3.5 does not define (typos).
"""
import json
import os
import re
import sys

from pyspark.sql import SparkSession

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from spark_dist.cli.commands import read_properties  # noqa: E402

# Keys Spark builds from a resource name, and spark_dist's own: not in Spark's registry of entries.
_DYNAMIC = re.compile(r"^spark\.(driver|executor|task|worker)\.resource\.\w+\.(amount|discoveryScript|vendor)$")
_NOT_ENTRIES = {"spark.master", "spark.app.name"}
# Config objects that register their entries when first loaded (YARN and Kubernetes ones included).
_CONFIG_CLASSES = ("org.apache.spark.internal.config.package$", "org.apache.spark.internal.config.UI$",
                   "org.apache.spark.internal.config.Python$", "org.apache.spark.sql.internal.SQLConf$",
                   "org.apache.spark.deploy.yarn.config.package$", "org.apache.spark.deploy.k8s.Config$")


def main(session_file, log4j_file, *templates):
    props = read_properties(session_file)
    builder = SparkSession.builder.appName("conf-probe")
    for key, value in props.items():
        builder = builder.config(key, value)
    # Driver JVM options take effect only when the JVM starts, which this builder does.
    builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j_file}")
    spark = builder.getOrCreate()
    try:
        sc = spark.sparkContext
        jvm = sc._jvm
        conf = dict(sc.getConf().getAll())
        n = sc.defaultParallelism
        barrier = sc.parallelize(range(n), n).barrier().mapPartitions(lambda it: [sum(1 for _ in it)]).collect()

        log_manager = jvm.org.apache.logging.log4j.LogManager
        context = jvm.org.apache.logging.log4j.core.LoggerContext.getContext(False)
        spark_logger = log_manager.getLogger("org.apache.spark.SparkContext")
        log4j = {"location": str(context.getConfiguration().getConfigurationSource().getLocation()),
                 "spark_warn_enabled": spark_logger.isWarnEnabled(),
                 "spark_error_enabled": spark_logger.isErrorEnabled()}

        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        for name in _CONFIG_CLASSES:
            jvm.java.lang.Class.forName(name, True, loader)
        entries = jvm.org.apache.spark.internal.config.ConfigEntry
        unknown = {}
        for template in templates:
            keys = read_properties(template)
            unknown[os.path.basename(template)] = sorted(
                k for k in keys if not (k in _NOT_ENTRIES or k.startswith("spark.dist.") or _DYNAMIC.match(k)
                                        or entries.findEntry(k) is not None))
        json.dump({"conf": {k: conf.get(k) for k in props}, "barrier": barrier, "default_parallelism": n,
                   "log4j": log4j, "unknown_keys": unknown}, sys.stdout)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
