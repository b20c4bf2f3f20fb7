"""Where the dataset cache goes, whether every executor can reach it, and how a cache directory is deleted.

Where the cache lives: ``petastorm.spark.converter.parentCacheDirUrl`` (the key Petastorm reads) when set,
else a fresh directory under ``spark.local.dir`` or the system temp dir, as a ``file://`` URL.
Executors write the cache and ranks read it, so it must be a filesystem all of them see. The default
``file://`` directory works with ``local[N]``, ``local-cluster`` and a standalone cluster whose workers all
run on the driver's machine; when an executor runs on another host, :func:`_check_reachable` refuses it
before any job. A ``file:`` directory the user named (an NFS mount, ``/dbfs``) is accepted once every
executor host was seen to find a marker file the driver wrote there.
"""
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
from typing import Iterable, List, Optional
from urllib.parse import urlparse

from ...host import tempdirs
from ...spark import session
from ..handle import DatasetError
from ..urls import local_path, readable_url

logger = logging.getLogger(__name__)

CACHE_DIR_CONF = "petastorm.spark.converter.parentCacheDirUrl"

_lock = threading.Lock()                # guards _default_parent: threads prepare datasets at once
_default_parent: Optional[str] = None   # the directory this process created when the conf was not set
_seen_by_executors: set = set()  # (application id, cache dir URL) that every executor host was seen to see


def checked_parent(spark) -> str:
    """The URL of the directory the caches go under (:func:`_parent_url`), once every executor is known to reach
    it (:func:`_check_reachable`): where a ``prepare_datasets`` call's writes go.

    Raises:
        DatasetError: as :func:`_parent_url` and :func:`_check_reachable` say, naming the conf key.
    """
    url = _parent_url(spark)
    _check_reachable(spark, url)
    return url


def _parent_url(spark) -> str:
    """The URL of the directory the caches go under (see the module docstring).

    Raises:
        DatasetError: the conf names a URL without a scheme, or a scheme the ranks cannot read.
    """
    global _default_parent
    url = spark.conf.get(CACHE_DIR_CONF, None)
    if url:
        if not urlparse(url).scheme:
            raise DatasetError(f"{CACHE_DIR_CONF}={url!r} has no scheme; write it as a URL, e.g. "
                               f"'file://{url}' or 'hdfs://...'")
        readable_url(url)  # before the write: a scheme the ranks cannot read is refused now, naming the key
        return url.rstrip("/")
    if session.is_connect(spark):
        driver = spark.conf.get("spark.driver.host", None) or "?"
        if remote_hosts("127.0.0.1", [driver]):
            raise DatasetError(
                f"under Spark Connect the driver runs on {driver}, not on this machine, so the dataset cache "
                f"cannot default to a directory here: set {CACHE_DIR_CONF} (spark.conf.set) to a filesystem every "
                "executor sees (hdfs://..., s3a://..., or a file: mount present on all hosts)")
    with _lock:
        if _default_parent is None or not os.path.isdir(_default_parent):
            local_dirs = (session.conf_snapshot(spark).get("spark.local.dir") or "").split(",")
            base = next((d for d in local_dirs if d and os.path.isdir(d)), tempfile.gettempdir())
            _default_parent = tempdirs.make("cache", parent=base)  # also sweeps those of dead drivers
        return "file://" + _default_parent


def _remove_default_parent() -> None:
    """Delete the directory :func:`_parent_url` made when the conf was not set (once no cache is left in it)."""
    global _default_parent
    with _lock:
        if _default_parent is not None:
            shutil.rmtree(_default_parent, ignore_errors=True)  # made by mkdtemp in this process: ours
            _default_parent = None


def delete_dir(url: str, ignore_errors: bool = False) -> None:
    """Delete the directory ``url`` (a cache) and what it holds: with ``shutil`` where it is local (a mounted
    ``dbfs:/`` too), else through ``pyarrow.fs``; ``ignore_errors`` as ``shutil.rmtree`` takes it, for a local
    directory only (``pyarrow.fs`` raises its errors either way, as both callers' paths did before)."""
    import shutil

    readable = readable_url(url)
    path = local_path(readable)
    if path is not None:
        shutil.rmtree(path, ignore_errors=ignore_errors)
        return
    from pyarrow import fs as pafs

    filesystem, fs_path = pafs.FileSystem.from_uri(readable)
    filesystem.delete_dir(fs_path)


def remote_hosts(driver_host: str, executor_hosts: Iterable[str]) -> List[str]:
    """The executor hosts that are not the driver's machine (loopback and the machine's own names count
    as the driver's). A pure function, so the multi-host rule is testable on one machine."""
    own = {driver_host, "localhost", socket.gethostname()}
    own_ips: set = set()

    def ips(host: str) -> set:
        try:
            return {ipaddress.ip_address(host).compressed}
        except ValueError:
            try:
                return {ai[4][0] for ai in socket.getaddrinfo(host, None)}
            except OSError:
                return set()

    def is_own(host: str) -> bool:
        if host in own:
            return True
        addrs = ips(host)
        if addrs and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
            return True
        if not own_ips:  # resolved only when a name is not obviously ours: lookups can be slow
            for h in own:
                own_ips.update(ips(h))
        return bool(addrs) and addrs <= own_ips

    return sorted({h for h in executor_hosts if not is_own(h)})


def _check_reachable(spark, parent_url: str) -> None:
    """Refuse a ``file:`` cache that executors on other hosts cannot see, before any write.

    The default directory (on the driver's disk) is refused outright when executors run elsewhere. A
    directory the user named in the conf may be a shared mount (NFS, ``/dbfs``): the executors are asked
    whether they see a marker file the driver writes there (one small Spark job, once per directory and
    application).

    Raises:
        DatasetError: the default directory while executors run on other hosts, or a named directory that
            executors on some host do not see; the message names the conf key.
    """
    if session.is_local_master(spark) or urlparse(parent_url).scheme != "file":
        return
    driver_host = session.conf_snapshot(spark).get("spark.driver.host") or socket.gethostname()
    app_id = session.app_id(spark)
    hosts, blind = session.executor_hosts(spark), None
    counted = hosts is not None  # the driver's entry included
    if not counted:  # Spark Connect has no API for the executors' hosts: the marker job tells them too
        if (app_id, parent_url) in _seen_by_executors:
            return
        try:
            seen = _marker_seen(spark, local_path(parent_url), tasks=4)
        except OSError as exc:  # the directory is the cluster's, not this client's: the executors decide
            logger.warning("spark_dist: cannot check from this Spark Connect client that every executor sees "
                           "the dataset cache %s (%s); on a multi-host cluster it must be a shared mount",
                           parent_url, exc)
            return
        hosts, blind = sorted({host for host, _ in seen}), sorted({host for host, found in seen if not found})
    far = remote_hosts(driver_host, hosts)
    if far and not spark.conf.get(CACHE_DIR_CONF, None):
        raise DatasetError(
            f"the dataset cache {parent_url} is on the driver's local disk, but executors run on other hosts "
            f"({', '.join(far)}) and could neither write it nor read it; set {CACHE_DIR_CONF} to a filesystem "
            "every executor sees (hdfs://..., s3a://..., or file:/dbfs/... or an NFS mount present on all hosts)")
    if far and (app_id, parent_url) not in _seen_by_executors:
        if blind is None:
            blind = sorted({host for host, found in _marker_seen(spark, local_path(parent_url), 2 * len(hosts))
                            if not found})
        if blind:
            raise DatasetError(
                f"{CACHE_DIR_CONF}={parent_url}: executors on {', '.join(blind)} do not see this directory (a "
                "marker file the driver wrote there was not found); mount it on every host or set the key to "
                "a filesystem every executor sees (hdfs://..., s3a://...)")
        _seen_by_executors.add((app_id, parent_url))
    if counted and len(hosts) <= 1:
        logger.warning("spark_dist: no executor has registered yet, so cannot check that they all see the "
                       "dataset cache %s; on a multi-host cluster set %s to a shared filesystem",
                       parent_url, CACHE_DIR_CONF)


def _marker_seen(spark, directory: str, tasks: int) -> List[tuple]:
    """``(executor host, whether it found the marker)`` from ``tasks`` tasks (at least 2, so that every
    executor runs one), for a marker file the driver writes in ``directory`` now and deletes after."""
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, f".spark_dist-marker-{uuid.uuid4().hex}")
    with open(marker, "w") as f:
        f.write("written by the spark_dist driver to check that executors share this directory\n")
    try:
        def look(_index):
            import os as _os
            import socket as _socket

            host = _os.environ.get("SPARK_LOCAL_IP") or _socket.gethostname()
            return [(host, _os.path.exists(marker))]

        return session.run_on_executors(spark, max(tasks, 2), look)
    finally:
        os.unlink(marker)
