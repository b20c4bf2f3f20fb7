"""Horovod over gloo: every rank gets the variables ``horovodrun --gloo`` / ``horovod.spark.run`` would set, so
``hvd.init()`` with no arguments just works inside the training function.

Two implementations run a rank's ``import horovod.torch``, by ``spark.dist.horovod.impl``: ``horovod``, Horovod
itself, for which the driver hosts Horovod's HTTP rendezvous server; ``torch``, :mod:`spark_dist.horovod` (its
API on torch.distributed, joined through the torchrun variables: no build, no server); ``auto`` (the default),
Horovod where it is installed, else ours. The driver says once which one runs.

Ports: the rendezvous server is the only listener Horovod needs on the driver (under Spark Connect: on the
first task's executor); it binds the first free port of ``spark.dist.horovod.rendezvousPort`` when set, else
any free one. Horovod's own driver and task services (``horovodrun``, ``horovod.spark.run``) are not used.
What stays ephemeral is the ranks' traffic among themselves: gloo's full mesh, which each rank opens on ports
of its own host's choosing when ``hvd.init()`` runs (as DDP's gloo and NCCL do), so executors must be able to
reach each other on any port.

Horovod is imported only when this backend is chosen; its import is the availability check.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Dict, List, Optional

from ..config import CONF_HOROVOD_IMPL, CONF_HOROVOD_RENDEZVOUS_PORT
from ..errors import BackendUnavailableError, ConfigError
from ..wire.ranks import RankInfo
from ..wire.sealed_store import bind_in_range
from .base import Backend

INSTALL_HINT = (
    "install it with `make env` (builds horovod 0.28.1 with gloo and PyTorch support), or "
    "`pip install spark_dist[horovod]` with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 after applying the "
    "C++17 patch to horovod's CMakeLists.txt (see the README's set-up); or set spark.dist.horovod.impl=torch "
    "to run Horovod's API on torch.distributed, without Horovod; or choose backend='ddp'"
)
IMPLS = ("auto", "horovod", "torch")
_said: set = set()  # the implementations this process has named once


def chosen_impl(config) -> str:
    """``"horovod"`` or ``"torch"``: what ``spark.dist.horovod.impl`` asks for, ``auto`` resolved (Horovod
    where it is installed).

    Raises:
        ConfigError: the key holds another value, naming it.
    """
    conf = getattr(config, "spark_conf", None) or {}
    impl = str(conf.get(CONF_HOROVOD_IMPL, "auto")).strip().lower()
    if impl not in IMPLS:
        raise ConfigError(f"{CONF_HOROVOD_IMPL} must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "auto":
        from ..horovod.aliases import horovod_installed

        return "horovod" if horovod_installed() else "torch"
    return impl


class HorovodBackend(Backend):
    """Starts a gloo rendezvous server per attempt and describes each rank to Horovod."""

    name = "horovod"

    def __init__(self, config=None):
        super().__init__(config)
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self.impl = chosen_impl(config)

    def check_available(self) -> None:
        """Import ``horovod.torch`` on the driver: a missing or broken build fails here, before any job.

        Raises:
            BackendUnavailableError: horovod.torch cannot be imported, or Horovod was built without gloo.
        """
        if self.impl == "torch":
            _say_once("torch", "backend='horovod' runs Horovod's API on torch.distributed (spark_dist.horovod), "
                      f"without Horovod ({CONF_HOROVOD_IMPL}=horovod asks for Horovod itself)")
            return
        try:
            import horovod.torch as hvd
        except Exception as exc:  # ImportError, or a torch ABI mismatch surfacing as another error
            raise BackendUnavailableError(
                f"backend='horovod' needs horovod.torch, which cannot be imported here ({exc}): {INSTALL_HINT}"
            ) from exc
        if not hvd.gloo_built():
            raise BackendUnavailableError(
                f"backend='horovod' runs Horovod over gloo, but this Horovod was built without it: {INSTALL_HINT}")
        _say_once("horovod", "backend='horovod' runs Horovod itself "
                  f"({CONF_HOROVOD_IMPL}=torch runs its API on torch.distributed instead)")

    def start(self, ranks: List[RankInfo], driver_host: str, run_id: str,
              bind_address: Optional[str] = None) -> Dict[int, Dict[str, str]]:
        """Start the rendezvous server on ``bind_address`` (that address only; default ``driver_host``, which
        is what the ranks connect to) for this host plan, on the first free port of the run's
        ``spark.dist.horovod.rendezvousPort`` (any free port when unset).

        Returns:
            The Horovod variables for every rank, by rank number.

        Raises:
            ConfigError: every port ``spark.dist.horovod.rendezvousPort`` allows is taken, naming the key.
            OSError: the server cannot bind ``bind_address``.
        """
        if self.impl == "torch":  # the ranks meet through the torchrun variables: no server
            from ..horovod import IMPL_ENV

            return {r.rank: dict(_rank_env(r), **{IMPL_ENV: "torch"}) for r in ranks}
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler

        plan = [SlotInfo(hostname=r.host, rank=r.rank, local_rank=r.local_rank, cross_rank=r.cross_rank,
                         size=r.world_size, local_size=r.local_world_size, cross_size=r.cross_size)
                for r in sorted(ranks, key=lambda r: r.rank)]
        ports = self.config.horovod_rendezvous_ports if self.config is not None else None
        server_class = _server_class()
        self._server = bind_in_range(bind_address or driver_host, ports, CONF_HOROVOD_RENDEZVOUS_PORT,
                                     lambda host, port: server_class((host, port), RendezvousHandler))
        # init() sizes each scope (global, local_<host>, cross_<local rank>), so the server can clear a
        # scope once all its members are done with it.
        self._server.init(plan)
        port = self._server.server_address[1]
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default) at the end of every run.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=f"horovod-rendezvous-{run_id}", daemon=True)
        self._thread.start()

        common = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": driver_host,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
        }
        envs = {}
        for r in ranks:
            env = dict(common, **_rank_env(r))
            iface = gloo_iface(r.host)
            if iface:
                env["HOROVOD_GLOO_IFACE"] = iface
            envs[r.rank] = env
        return envs

    def stop(self) -> None:
        """Stop the server and close its socket. Safe to call twice, or after a failed ``start``."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None and self._thread.is_alive():
            server.shutdown()  # waits for serve_forever to return; would block forever if it never ran
        server.server_close()
        self._thread = None


def _rank_env(r: RankInfo) -> Dict[str, str]:
    return dict(HOROVOD_HOSTNAME=r.host, HOROVOD_RANK=str(r.rank), HOROVOD_SIZE=str(r.world_size),
                HOROVOD_LOCAL_RANK=str(r.local_rank), HOROVOD_LOCAL_SIZE=str(r.local_world_size),
                HOROVOD_CROSS_RANK=str(r.cross_rank), HOROVOD_CROSS_SIZE=str(r.cross_size))


def _say_once(impl: str, line: str) -> None:
    if impl not in _said:
        _said.add(impl)
        import sys

        sys.stderr.write(f"spark_dist: {line}\n")


def _server_class():
    """Horovod's rendezvous HTTP server, bound to the address given. Horovod's own ``RendezvousServer``
    binds all interfaces (``find_port`` uses ``''``); we bind the driver's address only."""
    from horovod.runner.http.http_server import RendezvousHTTPServer

    class _BoundRendezvousServer(RendezvousHTTPServer):
        daemon_threads = True  # a half-open request must not hold up stop()
        request_queue_size = 128  # every rank connects at once; HTTPServer's default backlog is 5

        def __init__(self, address, handler):
            self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            super().__init__(address, handler, False)

        def server_bind(self):
            # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can stall; the name is unused.
            import socketserver

            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = self.server_address[:2]

    return _BoundRendezvousServer


def gloo_iface(host: str) -> Optional[str]:
    """The network interface gloo should use on ``host``.

    ``HOROVOD_GLOO_IFACE`` in the driver's environment wins (as ``horovodrun --network-interface``). A host
    address that belongs to this machine (loopback: ``lo``) maps to its interface here. Otherwise ``None``,
    and the task names the interface of its own address (``ranks.with_gloo_interface``): the driver cannot
    see remote interface names.
    """
    forced = os.environ.get("HOROVOD_GLOO_IFACE")
    if forced:
        return forced
    from ..wire.ranks import interface_of

    return interface_of(host)
