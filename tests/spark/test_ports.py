"""Pinned ports for firewalled clusters: ``spark.dist.storePort`` (the run's store) and
``spark.dist.horovod.rendezvousPort`` (Horovod's rendezvous server), each a port or a range.

Parsing and binding are checked on real sockets without a JVM; one run on local[2] shows the ranks met on
the configured port, and one through Spark Connect shows the client draws from it."""
import os
import random
import socket

import pytest

from spark_dist import ConfigError, Distributor, get_context
from spark_dist.config import CONF_HOROVOD_RENDEZVOUS_PORT, CONF_STORE_PORT, RunConfig, port_range
from spark_dist.driver.first_task import STORE_PORTS, configured_ports_taken, ports_to_try
from spark_dist.wire.sealed_store import bind_in_range, bind_listener

from free_ports import free_ports, session_conf
from spark_jobs import jobs_started
from test_horovod import needs_horovod
from test_launcher import allreduce_and_describe


# -- parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [CONF_STORE_PORT, CONF_HOROVOD_RENDEZVOUS_PORT])
@pytest.mark.parametrize("value, ports", [("29500", (29500, 29500)), ("29500-29600", (29500, 29600)),
                                          (" 29500 - 29501 ", (29500, 29501)), ("65535", (65535, 65535)),
                                          ("", None)])
def test_a_port_or_a_range_is_read(key, value, ports):
    assert port_range({key: value}, key) == ports
    config = RunConfig.build(num_processes=2, spark_conf={key: value})
    assert (config.store_ports if key == CONF_STORE_PORT else config.horovod_rendezvous_ports) == ports


def test_unset_means_any_free_port():
    config = RunConfig.build(num_processes=2, spark_conf={})
    assert config.store_ports is None and config.horovod_rendezvous_ports is None


@pytest.mark.parametrize("key", [CONF_STORE_PORT, CONF_HOROVOD_RENDEZVOUS_PORT])
@pytest.mark.parametrize("value", ["abc", "0", "65536", "29600-29500", "29500-", "-29500", "1-2-3", "29500.5"])
def test_a_bad_value_names_the_key_before_any_job(key, value):
    with pytest.raises(ConfigError, match=f"Spark conf {key}='{value}' is not a port or a range of ports"):
        RunConfig.build(num_processes=2, spark_conf={key: value})


# -- binding on real sockets --------------------------------------------------------------------------------
def test_the_first_free_port_of_the_range_is_bound():
    first = free_ports(3)
    with bind_listener("127.0.0.1", first):  # someone else holds the first port
        with bind_in_range("127.0.0.1", (first, first + 2), CONF_STORE_PORT) as sock:
            assert sock.getsockname()[1] == first + 1
            with socket.create_connection(("127.0.0.1", first + 1), timeout=5):
                pass  # really listening


def test_a_taken_single_port_names_the_key_and_the_port():
    first = free_ports(2)
    with bind_listener("127.0.0.1", first):
        with pytest.raises(ConfigError, match=rf"spark\.dist\.storePort={first}: port {first} is taken on "
                                              rf"127\.0\.0\.1; free it, or give a range"):
            bind_in_range("127.0.0.1", (first, first), CONF_STORE_PORT)
        with bind_listener("127.0.0.1", first + 1):
            with pytest.raises(ConfigError, match=rf"storePort={first}-{first + 1}: every port of the range is "
                                                  "taken"):
                bind_in_range("127.0.0.1", (first, first + 1), CONF_STORE_PORT)


def test_without_a_range_any_free_port_is_bound():
    with bind_in_range("127.0.0.1", None, CONF_STORE_PORT) as sock:
        assert sock.getsockname()[1] > 0


# -- Spark Connect: the client's draws ----------------------------------------------------------------------
def test_connect_draws_distinct_ports_from_the_configured_range():
    draw = random.Random(7)
    assert ports_to_try((29500, 29500), draw) == [29500]  # one port: one try, no redraw
    tried = ports_to_try((29500, 29502), draw)
    assert sorted(tried) == [29500, 29501, 29502]  # a range smaller than the tries: each port once
    tried = ports_to_try((29500, 29600), draw)
    assert len(set(tried)) == len(tried) == 4 and all(29500 <= p <= 29600 for p in tried)
    tried = ports_to_try(None, draw)  # unset: the default range
    assert len(set(tried)) == 4 and all(STORE_PORTS[0] <= p < STORE_PORTS[1] for p in tried)


def test_connect_says_no_redraw_helps_a_single_taken_port():
    text = "RuntimeError: spark_dist-store-port-taken: port 29500 on 10.0.0.7: [Errno 98] Address in use"
    error = configured_ports_taken((29500, 29500), [29500], text)
    assert str(error).startswith("spark.dist.storePort=29500: port 29500 is taken on 10.0.0.7 (the first task's")
    assert "with a single port no redraw can help" in str(error)
    error = configured_ports_taken((29500, 29501), [29501, 29500], text)
    assert "spark.dist.storePort=29500-29501: ports 29501, 29500 were all taken on 10.0.0.7" in str(error)


# -- Horovod's rendezvous server (no Spark) -----------------------------------------------------------------
@needs_horovod
def test_horovod_rendezvous_binds_the_first_free_port_of_its_range():
    from spark_dist.backends.horovod import HorovodBackend
    from spark_dist.wire.ranks import TaskInfo, assign_ranks

    first = free_ports(2)
    ranks = assign_ranks([TaskInfo(0, "127.0.0.1"), TaskInfo(1, "127.0.0.1")])
    config = RunConfig.build(num_processes=2, backend="horovod",
                             spark_conf={CONF_HOROVOD_RENDEZVOUS_PORT: f"{first}-{first + 1}"})
    with bind_listener("127.0.0.1", first):
        backend = HorovodBackend(config)
        try:
            envs = backend.start(ranks, "127.0.0.1", "test")
            assert envs[1]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(first + 1)
            with socket.create_connection(("127.0.0.1", first + 1), timeout=5):
                pass
        finally:
            backend.stop()
        single = RunConfig.build(num_processes=2, backend="horovod",
                                 spark_conf={CONF_HOROVOD_RENDEZVOUS_PORT: str(first)})
        with pytest.raises(ConfigError, match=rf"spark\.dist\.horovod\.rendezvousPort={first}: port {first} is "
                                              "taken"):
            HorovodBackend(single).start(ranks, "127.0.0.1", "test")


# -- runs ---------------------------------------------------------------------------------------------------
def test_the_store_listens_on_the_configured_port(spark_local):
    first = free_ports(3)
    with bind_listener("127.0.0.1", first), session_conf(spark_local, CONF_STORE_PORT, f"{first}-{first + 2}"):
        out = Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)
    # The ranks met and ran init_process_group() through the store on the range's first free port.
    assert out["sum"] == 3.0
    assert {v["env"]["MASTER_PORT"] for v in out["views"]} == {str(first + 1)}
    assert spark_local.conf.get(CONF_STORE_PORT, None) is None  # the user's conf is as it was


def fail_on_the_first_attempt():
    ctx = get_context()
    if ctx.attempt == 0 and ctx.rank == 1:
        raise RuntimeError("the first attempt fails")
    return os.environ["MASTER_PORT"], ctx.attempt


def test_a_retry_binds_the_single_configured_port_again(spark_local):
    # The usual firewall set-up: one open port. The failed attempt's store has let it go by the retry.
    port = free_ports(1)
    with session_conf(spark_local, CONF_STORE_PORT, str(port)):
        assert Distributor(num_processes=2, max_retries=1, verbose=False).run(fail_on_the_first_attempt) == (
            str(port), 1)


def test_a_taken_store_port_fails_before_any_job(spark_local):
    first = free_ports(1)
    with bind_listener("127.0.0.1", first), session_conf(spark_local, CONF_STORE_PORT, str(first)):
        jobs_before = jobs_started(spark_local)  # every job, whatever its group (a run's has its own)
        with pytest.raises(ConfigError, match=rf"spark\.dist\.storePort={first}: port {first} is taken"):
            Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)
        assert jobs_started(spark_local) == jobs_before


def test_connect_hosts_the_store_on_the_configured_port(spark_connect):
    first = free_ports(1)
    with session_conf(spark_connect, CONF_STORE_PORT, str(first)):
        out = Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)
        assert {v["env"]["MASTER_PORT"] for v in out["views"]} == {str(first)}
        # The first task closed the run's store before its task ended, so before run() returned: a run started
        # at once on the same port finds it free, and here it is taken by something else instead.
        with bind_listener("127.0.0.1", first):  # the first task's executor runs on this machine
            with pytest.raises(ConfigError, match=rf"spark\.dist\.storePort={first}: port {first} is taken on "
                                                  r"127\.0\.0\.1 .*no redraw can help"):
                Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1)

