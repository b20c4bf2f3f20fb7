"""The run's store in the first task, where it lives under Spark Connect: the client may be unreachable from
the executors, so the first barrier task hosts the store and runs the
:class:`~spark_dist.driver.coordinator.Coordinator` next to its own rank (:func:`host_and_watch`).

The other tasks find it without a barrier sync (``allGather`` costs a second): its host is the first task's
executor host (``getTaskInfos``, static) and its port the one the client drew for the attempt
(:func:`ports_to_try`: from ``spark.dist.storePort`` when set, for a firewall that opens only those). A port
that turns out taken there fails the first task with a marked error (:data:`PORT_TAKEN`), and the client
relaunches the attempt on another port (not counted as a retry).

What comes back: every task's records and, from the first task, what its coordinator saw (:class:`FirstTaskReport`).
The ranks' ``ctx.report`` records and printed lines reach the client with it, at the end of the attempt:
Connect has no channel from executors to the client while a job runs. Both are bounded tails, with a count
of what was dropped (:class:`~.report_tail.ReportTail`, :class:`~spark_dist.task.output.OutputTail`). A host
that went silent would keep the job from ending, so the first task then fails the stage on purpose, carrying what it saw in its error
(:func:`verdict`, read back by :func:`verdict_in`).

:func:`host_and_watch` runs in the task: the task side gets it as a callable inside the job's closure
(:func:`~spark_dist.task.partition.run_partition`), so ``task`` never imports ``driver``.
"""
from __future__ import annotations

import base64
import dataclasses
import errno
import pickle
import random
import re
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from ..config import CONF_STORE_PORT, RunConfig
from ..errors import ConfigError
from ..task import output
from ..wire import abort_watch
from ..wire.protocol import ABORT, Abort, LaunchSpec
from ..wire.sealed_store import SealedStore, bind_listener, host_store
from ..wire.sealing import Sealer
from .outcome import AttemptEvidence
from .report_tail import ReportTail

VERDICT = "spark_dist-verdict"  # brackets what the first task saw, in the error that fails the stage
PORT_TAKEN = "spark_dist-store-port-taken"
STORE_PORTS = (20000, 32000)  # below Linux's ephemeral range, so outgoing connections rarely hold one
_PORT_ATTEMPTS = 4
_TAKEN_AT = re.compile(re.escape(PORT_TAKEN) + r": port \d+ on (\S+): ")


def ports_to_try(configured: Optional[Tuple[int, int]], draw: random.Random) -> List[int]:
    """The store ports the client tries for one attempt, in order: up to ``_PORT_ATTEMPTS`` distinct ones
    drawn from ``spark.dist.storePort``'s range (``(first, last)``, both included) when set, else from
    :data:`STORE_PORTS`. Drawn, not taken in order: the client cannot see which are free on the executor,
    and concurrent runs would otherwise all try the first port first."""
    first, last = configured or (STORE_PORTS[0], STORE_PORTS[1] - 1)
    return draw.sample(range(first, last + 1), min(_PORT_ATTEMPTS, last - first + 1))


def configured_ports_taken(ports: Tuple[int, int], tried: List[int], error_text: str) -> ConfigError:
    """The error for a run whose every drawn ``spark.dist.storePort`` port was taken on the first task's
    executor (``error_text``: the task's marked error, which names the host)."""
    found = _TAKEN_AT.search(error_text)
    where = f"on {found.group(1)} " if found else ""
    first, last = ports
    if first == last:
        return ConfigError(f"{CONF_STORE_PORT}={first}: port {first} is taken {where}(the first task's executor, "
                           "which hosts the run's store under Spark Connect); with a single port no redraw can "
                           f"help: free it, or give a range (for example {first}-{min(first + 100, 65535)})")
    return ConfigError(f"{CONF_STORE_PORT}={first}-{last}: ports {', '.join(map(str, tried))} were all taken "
                       f"{where}(the first task's executor, which hosts the run's store under Spark Connect); "
                       "widen the range")


@dataclass(frozen=True)
class FirstTaskReport:
    """What the first task's coordinator saw, and the reports it relayed (a bounded tail: :mod:`.report_tail`)."""

    seen: AttemptEvidence
    reports: tuple
    output: tuple = ()  # (rank, stream, line): the tail of what each rank printed (output.OutputTail)


def verdict(report: FirstTaskReport, secret: bytes) -> str:
    """``report`` as text for an error message, sealed with the attempt's secret like every store value: the
    message shows in the Spark UI, so what the ranks printed and reported must not be readable there."""
    sealed = Sealer(secret).seal(VERDICT, zlib.compress(pickle.dumps(report)))
    return f"{VERDICT}<{base64.b64encode(sealed).decode()}>"


def verdict_in(text: str, secret: bytes) -> Optional[FirstTaskReport]:
    """What the first task saw, from the error with which it failed the stage on purpose (``None`` when the
    text holds none, or one not sealed with ``secret``: it is never unpickled then)."""
    found = re.search(re.escape(VERDICT) + r"<([A-Za-z0-9+/=]+)>", text)
    if not found:
        return None
    data = Sealer(secret).open_sealed(VERDICT, base64.b64decode(found.group(1)))
    return None if data is None else pickle.loads(zlib.decompress(data))


def host_and_watch(config: RunConfig, time_left: Optional[float], spec: LaunchSpec,
                   serve: Callable[[], List[Any]]) -> List[Any]:
    """In the first task: host the store on ``spec.store_host:spec.store_port`` and run the coordinator
    beside ``serve()`` (this task's own ranks); returns their records plus what the coordinator saw.

    Raises:
        RuntimeError: marked :data:`PORT_TAKEN` when the port is taken here (the client relaunches on
            another); the coordinator's own failure; or, carrying the :func:`verdict`, ranks that went silent
            (their tasks would hold the job open until Spark's own timeout).
    """
    from ..backends import get_backend
    from .coordinator import Coordinator

    try:
        listener = bind_listener(spec.store_host, spec.store_port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # the client relaunches on another port
            raise RuntimeError(f"{PORT_TAKEN}: port {spec.store_port} on {spec.store_host}: {exc}") from None
        raise RuntimeError(f"spark_dist: the first task cannot listen on {spec.store_host} (its executor's "
                           f"address as Spark knows it): {exc}") from exc
    server, _ = host_store(spec.store_host, spec.rendezvous_timeout, listener)
    store = SealedStore(server, spec.secret, spec.prefix)
    backend = get_backend(config.backend, config)
    reports = ReportTail()  # the client gets the reports only at the end too: each rank's latest, and a count
    lines = output.OutputTail()  # the client gets the lines only at the end: a bounded tail of each rank's
    give_up = threading.Event()
    deadline = None if time_left is None else time.monotonic() + max(time_left, 0.0)
    config = dataclasses.replace(config, driver_host=spec.store_host)
    # No Spark job to wait for here: the watch ends once every rank has ended, or on give_up.
    coordinator = Coordinator(store, config, spec, backend, job_ended=None, cancel=give_up.set,
                              on_report=reports, deadline=deadline, host=spec.store_host,
                              on_output=lines)
    crashed: List[BaseException] = []

    def watch():
        try:
            coordinator.watch(give_up.wait)
        except BaseException as exc:  # noqa: BLE001 -- e.g. the backend cannot start here: stop every rank
            crashed.append(exc)
            give_up.set()
            try:
                store.put(ABORT, Abort.CANCELLED)
            except Exception:  # noqa: BLE001
                pass

    watcher = threading.Thread(target=watch, daemon=True, name="spark_dist-coordinator")
    watcher.start()
    try:
        records = list(serve())
        watcher.join()
        if crashed:  # the stage fails with the real cause
            raise RuntimeError(f"spark_dist: the run's coordinator failed in the first task: {crashed[0]!r}") \
                from crashed[0]
        coordinator.drain_reports(final=True)
        coordinator.drain_output(final=True)
        report = FirstTaskReport(coordinator.seen(), reports.items(), lines.items())
    finally:
        backend.stop()
        abort_watch.release(store)  # the supervisors' watches still waiting end before their connections do
    if coordinator.lost_ranks:
        raise RuntimeError(f"spark_dist: ranks {[r.rank for r in coordinator.lost_ranks]} went silent; "
                           f"{verdict(report, spec.secret)}")
    return records + [report]
