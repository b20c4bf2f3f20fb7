"""The Horovod backend and HorovodRunner's signature without Spark."""
import inspect
import os
import socket

import psutil
import pytest

from spark_dist import ConfigError, HorovodRunner
from spark_dist.backends.horovod import HorovodBackend
from spark_dist.wire.ranks import TaskInfo, assign_ranks


try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except ImportError:
    HAVE_HOROVOD = False
needs_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod.torch is not installed (make env builds it)")


def horovod_runner_main(scale, offset=0.0):
    """A Databricks-style main: keyword arguments only."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="sum")
    return {"size": hvd.size(), "value": float(total) * scale + offset, "parent": os.getppid()}


# -- the backend on its own ---------------------------------------------------------------------------------
def _listening(port):
    return [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


@needs_horovod
def test_backend_describes_every_rank_and_listens_on_the_driver_address_only():
    ranks = assign_ranks([TaskInfo(0, "127.0.0.1"), TaskInfo(1, "127.0.0.1")])
    backend = HorovodBackend()
    backend.check_available()
    envs = backend.start(ranks, "127.0.0.1", "test")
    try:
        port = int(envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        assert [c.laddr.ip for c in _listening(port)] == ["127.0.0.1"]  # not 0.0.0.0, not ::
        assert envs[1]["HOROVOD_RANK"] == "1" and envs[1]["HOROVOD_SIZE"] == "2"
        assert envs[1]["HOROVOD_LOCAL_RANK"] == "1" and envs[1]["HOROVOD_LOCAL_SIZE"] == "2"
        assert envs[1]["HOROVOD_CROSS_RANK"] == "0" and envs[1]["HOROVOD_CROSS_SIZE"] == "1"
        assert envs[0]["HOROVOD_CONTROLLER"] == "gloo" and envs[0]["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert envs[0]["HOROVOD_GLOO_IFACE"] == "lo" and envs[0]["HOROVOD_HOSTNAME"] == "127.0.0.1"
    finally:
        backend.stop()
    backend.stop()  # idempotent
    assert _listening(port) == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@needs_horovod
def test_horovod_runner_on_the_driver():
    # np < 0: -np processes on the driver, no Spark job; "log_callback_only" keeps the driver quiet.
    out = HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").run(horovod_runner_main, scale=2.0)
    assert out["size"] == 2 and out["value"] == 2.0
    assert out["parent"] == os.getpid()  # rank 0 was a child of this (driver) process


def test_horovod_runner_keeps_databricks_signature():
    # Databricks' own test: keyword-only np and driver_log_verbosity (default "log_callback_only"),
    # run(self, main, **kwargs).
    init = inspect.getfullargspec(HorovodRunner.__init__)
    assert (init.args, init.varargs, init.varkw, init.kwonlyargs, init.kwonlydefaults) == (
        ["self"], None, None, ["np", "driver_log_verbosity"], {"driver_log_verbosity": "log_callback_only"})
    run = inspect.getfullargspec(HorovodRunner.run)
    assert (run.args, run.varargs, run.varkw, run.kwonlyargs) == (["self", "main"], None, "kwargs", [])
    with pytest.raises(TypeError):
        HorovodRunner(2)
    assert HorovodRunner(np=-1).num_processor == -1  # Databricks' attribute


def test_horovod_runner_checks_its_arguments():
    with pytest.raises(ConfigError, match="np must be an int"):
        HorovodRunner(np="2")
    with pytest.raises(ConfigError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="some")
