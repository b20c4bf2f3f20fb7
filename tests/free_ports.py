"""Helpers for tests that pin ports: a run of free ports, and a runtime conf key set for one block."""
import contextlib
import random

from spark_dist.wire.sealed_store import bind_listener


def free_ports(count):
    """The first of ``count`` consecutive ports that are free on 127.0.0.1 now (below Linux's ephemeral
    range, so outgoing connections rarely take one meanwhile)."""
    draw = random.Random()
    for _ in range(200):
        first = draw.randrange(21000, 31000)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    held.enter_context(bind_listener("127.0.0.1", port))
            except OSError:
                continue
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
