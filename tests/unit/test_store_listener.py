"""Where the run's store listens: one address only, a port of a pinned range, and the address its own clients dial."""
import errno
import socket
from datetime import timedelta

import pytest

from spark_dist.config import CONF_STORE_PORT
from spark_dist.errors import ConfigError
from spark_dist.wire.sealed_store import bind_in_range, bind_listener, host_store, join_store, own_address


class Ports:
    """A stand-in for ``bind_listener``: ports in ``taken`` are in use, binding any other yields it."""

    def __init__(self, taken=(), error=errno.EADDRINUSE):
        self.taken, self.error, self.tried = set(taken), error, []

    def __call__(self, host, port):
        self.tried.append(port)
        if port in self.taken:
            raise OSError(self.error, "taken")
        return (host, port)


def test_no_range_binds_any_free_port():
    ports = Ports()
    assert bind_in_range("10.0.0.5", None, CONF_STORE_PORT, ports) == ("10.0.0.5", 0) and ports.tried == [0]


def test_the_first_free_port_of_the_range_is_bound():
    ports = Ports(taken={29500, 29501})
    assert bind_in_range("10.0.0.5", (29500, 29503), CONF_STORE_PORT, ports) == ("10.0.0.5", 29502)
    assert ports.tried == [29500, 29501, 29502]
    assert bind_in_range("10.0.0.5", (29500, 29502), CONF_STORE_PORT, ports) == ("10.0.0.5", 29502)  # the last one


@pytest.mark.parametrize("ports, message", [
    ((29500, 29500), "spark.dist.storePort=29500: port 29500 is taken on 10.0.0.5; free it, or give a range (for "
                     "example 29500-29600) so that another run or attempt can take the next port"),
    ((65500, 65500), "spark.dist.storePort=65500: port 65500 is taken on 10.0.0.5; free it, or give a range (for "
                     "example 65500-65535) so that another run or attempt can take the next port"),
    ((29500, 29502), "spark.dist.storePort=29500-29502: every port of the range is taken on 10.0.0.5; widen the "
                     "range"),
])
def test_every_port_taken_names_the_key_and_what_to_do(ports, message):
    with pytest.raises(ConfigError) as raised:
        bind_in_range("10.0.0.5", ports, CONF_STORE_PORT, Ports(taken=range(ports[0], ports[1] + 1)))
    assert str(raised.value) == message


def test_a_privileged_port_names_the_key_at_once():
    ports = Ports(taken={80, 81}, error=errno.EACCES)
    with pytest.raises(ConfigError) as raised:
        bind_in_range("10.0.0.5", (80, 81), CONF_STORE_PORT, ports)
    assert str(raised.value) == ("spark.dist.storePort: port 80 on 10.0.0.5 needs privileges this process lacks "
                                 "([Errno 13] taken); use ports above 1023")
    assert ports.tried == [80]


def test_an_address_of_no_interface_here_fails_at_once_whatever_the_range():
    ports = Ports(taken={29500, 29501}, error=errno.EADDRNOTAVAIL)
    with pytest.raises(OSError) as raised:
        bind_in_range("10.9.9.9", (29500, 29501), CONF_STORE_PORT, ports)
    assert raised.value.errno == errno.EADDRNOTAVAIL and ports.tried == [29500]


def test_each_listener_gets_a_free_port_of_its_own():
    first, second = bind_listener("127.0.0.1"), bind_listener("127.0.0.1")
    try:
        assert first.getsockname()[1] != second.getsockname()[1]
        assert first.type == socket.SOCK_STREAM
    finally:
        first.close()
        second.close()


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_address_gets_an_ipv6_listener():
    sock = bind_listener("::1")
    try:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"
    finally:
        sock.close()


@pytest.mark.parametrize("bind_host, dial", [("0.0.0.0", "127.0.0.1"), ("::", "::1"), ("", "127.0.0.1"),
                                             ("10.0.0.5", "10.0.0.5"), ("driver.example", "driver.example")])
def test_a_server_on_a_wildcard_is_dialled_on_loopback(bind_host, dial):
    assert own_address(bind_host) == dial


def test_both_ends_of_the_store_use_the_timeout_given():
    server, port = host_store("127.0.0.1", 7)
    try:
        assert server.timeout == timedelta(seconds=7)
        assert join_store("127.0.0.1", port, 3).timeout == timedelta(seconds=3)
    finally:
        del server
