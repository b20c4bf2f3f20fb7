"""The network interface a rank's collectives use (gloo's, Horovod's): the one that holds its task's Spark address."""
import socket
from types import SimpleNamespace

import psutil
import pytest

from spark_dist.wire.ranks import interface_of, with_gloo_interface

# This machine's interfaces as psutil.net_if_addrs() gives them (only .address is read).
INTERFACES = {
    "lo": [SimpleNamespace(address="127.0.0.1"), SimpleNamespace(address="::1")],
    "eth0": [SimpleNamespace(address="10.0.0.5"), SimpleNamespace(address="fe80::1%eth0")],
    "ib0": [SimpleNamespace(address="192.168.7.2")],
}


@pytest.fixture
def interfaces(monkeypatch):
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: INTERFACES)
    for key in ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("host, interface", [("10.0.0.5", "eth0"), ("192.168.7.2", "ib0"), ("127.0.0.1", "lo"),
                                             ("fe80::1", "eth0"), ("10.9.9.9", None)])
def test_the_interface_is_the_one_holding_the_address(interfaces, host, interface):
    assert interface_of(host) == interface


def test_a_host_name_that_does_not_resolve_has_no_interface(interfaces, monkeypatch):
    def unresolvable(host, port):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    assert interface_of("gone.example") is None


def test_gloo_and_horovod_get_the_interface_of_the_tasks_address(interfaces):
    assert with_gloo_interface({"RANK": "0"}, "10.0.0.5") == {
        "RANK": "0", "GLOO_SOCKET_IFNAME": "eth0", "HOROVOD_GLOO_IFACE": "eth0"}
    assert with_gloo_interface({"RANK": "0"}, "10.9.9.9") == {"RANK": "0"}  # no interface holds it: gloo's own pick


def test_the_users_choice_of_interface_wins(interfaces, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")  # in the executor's environment
    assert with_gloo_interface({"RANK": "0"}, "10.0.0.5") == {"RANK": "0", "HOROVOD_GLOO_IFACE": "eth0"}
    # ... or in the rank's: nothing left to choose, nothing looked up.
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: pytest.fail("looked up an interface"))
    assert with_gloo_interface({"HOROVOD_GLOO_IFACE": "ib0"}, "10.0.0.5") == {"HOROVOD_GLOO_IFACE": "ib0"}
