"""Helpers for tests that pin ports: a run of free ports, and a runtime conf key set for one block."""
import contextlib
import random

import pyspark

from spark_dist.wire.sealed_store import bind_listener

# Both Spark lines' suites run at once on one machine (`make test`), and a port found free here is bound later
# by Spark or spark_dist, not by us: each line draws from its own range, so the two never pick the same port
# in that window. Both lie below Linux's ephemeral range (32768-60999), which outgoing connections take from.
LINE_PORTS = (21000, 26000) if int(pyspark.__version__.split(".")[0]) >= 4 else (26000, 31000)
_handed_out = set()  # by this process: never twice


def free_ports(count):
    """The first of ``count`` consecutive ports that are free on 127.0.0.1 now, drawn at random from this Spark
    line's own range (:data:`LINE_PORTS`)."""
    draw = random.Random()
    low, high = LINE_PORTS
    for _ in range(200):
        first = draw.randrange(low, high - count)
        ports = set(range(first, first + count))
        if ports & _handed_out:  # found free before, maybe not bound yet (a master's port, then its UI's)
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in sorted(ports):
                    held.enter_context(bind_listener("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.update(ports)
            return first
    raise AssertionError("no free run of ports")


@contextlib.contextmanager
def session_conf(spark, key, value):
    """``key`` set to ``value`` in the session's runtime conf, and the user's value (or none) back after."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
