"""The caches this process made: found again for the same data, written once, evicted, and deleted.

A cache is keyed by application, parent directory, the DataFrame (the same data as ``sameSemantics``
judges) and the files it reads. Caches are kept per application, least recently used evicted beyond
:data:`MAX_CACHED_DATASETS`, and deleted by :func:`clear_cache`, when the SparkContext stops, or when this
process exits. Neither eviction nor :func:`clear_cache` deletes a cache in use: one a run reads
(:func:`in_use`, :func:`not_evicted`), one being written, or one a ``prepare_datasets`` call still under way has
handed out. A call is one :func:`preparing` block, and each dataset in it one :meth:`Call.claim`: the cache found
again, or this thread's to write (:meth:`Claim.made`) and keep (:meth:`Claim.keep`).
"""
import atexit
import contextlib
import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from ...spark import session
from ..handle import DatasetHandle
from ..urls import local_path
from .location import _remove_default_parent, delete_dir

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    app_id: str
    parent_url: str
    df: Any               # the user's DataFrame: df.sameSemantics() finds it again
    inputs: tuple         # the files it reads, with sizes and modification times (see _input_files)
    converter: Any        # petastorm SparkDatasetConverter
    handle: DatasetHandle
    owned: bool           # False when Petastorm handed back a cache the user made: never delete that


@dataclass
class _Write:
    """A cache being written now: another thread preparing the same data waits for ``done``."""

    app_id: str
    parent_url: str
    df: Any
    inputs: tuple
    done: threading.Event


def _same_data(item, app_id: str, parent_url: str, df, inputs: tuple) -> bool:
    """``item`` (an :class:`_Entry` or a :class:`_Write`) holds ``df``'s data for this application and dir:
    the same plan over the same files, unchanged (a re-read of a path whose files changed has the same plan).

    ``sameSemantics`` is PySpark's public test (on a classic session: the analyzed plans' ``sameResult``,
    Spark's own test for cache hits); it also works under Spark Connect. It runs last: it is a call into
    Spark, the others compare Python values.
    """
    return (item.app_id == app_id and item.parent_url == parent_url and item.inputs == inputs
            and item.df.sameSemantics(df))


def _input_files(spark, df) -> tuple:
    """``((url, length, modification time), ...)`` of the files ``df`` reads (``DataFrame.inputFiles``, no
    Spark job): rewritten, added or removed files make another cache key."""
    identity = []
    for url in sorted(df.inputFiles()):
        path = local_path(url)
        if path is not None:
            try:
                info = os.stat(path)
                identity.append((url, info.st_size, info.st_mtime_ns))
            except OSError:
                if session.is_connect(spark):  # the file may be on the server's side only: ask Spark
                    identity.append((url, *session.file_identity(spark, url)))
                else:  # gone already: the write will say so; no cache can match it meanwhile
                    identity.append((url, -1, -1))
        else:
            identity.append((url, *session.file_identity(spark, url)))
    return tuple(identity)


def _app_id(spark) -> str:
    """The id of ``spark``'s application: caches are kept, evicted and cleared per application."""
    return session.app_id(spark)


_lock = threading.RLock()
_entries: List[_Entry] = []
_writing: List["_Write"] = []           # the writes under way
_in_use: Dict[str, int] = {}            # cache dir URL -> runs reading it, or calls handing it out, now
_preparing = 0                          # prepare_datasets calls under way (each may write in the default dir)
_owner_pid = os.getpid()                # forked children inherit this module's state, not its caches
_atexit_registered = False
# Caches kept per application, least recently used evicted first: a Pipeline or CrossValidator makes a new
# DataFrame (a new plan) on every fit, so without a bound the caches of a tuning run would pile up on disk.
MAX_CACHED_DATASETS = 8


@contextlib.contextmanager
def preparing(spark) -> Iterator["Call"]:
    """One ``prepare_datasets`` call under way, as a :class:`Call`. Until it returns, the caches it has handed
    out are in use, and the default parent dir (where its writes may go) stays: enter it before choosing that
    dir (:func:`clear_cache` removes it only when no call is under way). The application's caches are deleted
    when its SparkContext stops or this process exits (:func:`_register_cleanup`); once the call succeeds, the
    least recently used beyond :data:`MAX_CACHED_DATASETS` are evicted, never one it hands out."""
    global _preparing
    with _lock:
        _preparing += 1
    call = Call(spark)
    try:
        _register_cleanup(spark)
        call.app_id = _app_id(spark)
        yield call
        _evict(call.app_id, keep=set(call.held))
    finally:
        with _lock:
            _preparing -= 1
            _release(call.held)


class Call:
    """One :func:`preparing` call: its application (``app_id``) and the caches it holds (``held``, their URLs)."""

    def __init__(self, spark):
        self.spark = spark
        self.app_id = ""
        self.held: List[str] = []

    def hold(self, url: str) -> None:
        """Keep the cache ``url`` (of a handle passed back in) in use until the call returns."""
        _hold(self.held, url)

    @contextlib.contextmanager
    def claim(self, key: str, df) -> Iterator["Claim"]:
        """The cache of ``df``'s data under ``key`` (the parent dir a write goes to, or a Petastorm input's own
        slot, which no DataFrame's lookup finds): :attr:`Claim.found` where this application has it (held for
        the call), else this thread's to make, while another thread preparing the same data waits for it. A
        cache :meth:`Claim.made` recorded is deleted when the block fails before :meth:`Claim.keep`."""
        inputs = _input_files(self.spark, df)
        hit, mine = _find_or_claim(self.app_id, key, df, inputs, self.held)
        entry = _Entry(self.app_id, key, df, inputs, converter=None, handle=None, owned=False)  # type: ignore[arg-type]
        claim = Claim(self.held, hit, entry)
        try:
            yield claim
        except BaseException:
            claim.discard()
            raise
        finally:
            if mine is not None:
                _done_writing(mine)


class Claim:
    """A dataset's cache in a :meth:`Call.claim` block: :attr:`found` again, or made (:meth:`made`) and kept
    (:meth:`keep`) by this thread."""

    def __init__(self, held: List[str], hit: Optional[_Entry], entry: _Entry):
        self._held = held      # the call's: a cache kept is held for it
        self._hit = hit        # the registry's entry of the same data, or None
        self._entry = entry    # the entry this thread adds, once it has made the cache and kept its handle
        self._made = self._kept = False
        self.found: Optional[DatasetHandle] = hit.handle if hit is not None else None

    def made(self, converter, owned: bool) -> None:
        """The cache exists now: ``converter`` (Petastorm's ``SparkDatasetConverter``; ``None`` for a Petastorm
        dataset's files), ``owned`` unless it is the user's (then never deleted here)."""
        self._entry.converter = converter
        self._entry.owned = owned
        self._made = True

    def keep(self, handle: DatasetHandle) -> DatasetHandle:
        """Keep ``handle`` as the data's, for later calls to find (held for this one); returns it."""
        if self._hit is not None:  # found again, its stats completed
            self._hit.handle = handle
        else:
            self._entry.handle = handle
            _add(self._entry, self._held)
        self._kept = True
        return handle

    def discard(self) -> None:
        """Delete a cache made but not kept (the checks refused it)."""
        if self._made and not self._kept:
            _delete(self._entry)


def _hold(held: List[str], url: str) -> None:
    """Mark ``url`` in use until the :func:`preparing` call that yielded ``held`` ends."""
    with _lock:
        _in_use[url] = _in_use.get(url, 0) + 1
        held.append(url)


def _release(urls: Iterable[str]) -> None:
    with _lock:
        for url in urls:
            _in_use[url] -= 1
            if not _in_use[url]:
                del _in_use[url]


def _find_or_claim(app_id: str, parent_url: str, df, inputs: tuple,
                   held: List[str]) -> Tuple[Optional[_Entry], Optional[_Write]]:
    """``(entry, None)``: the cache of the same data (now the most recently used, and held for the caller);
    else ``(None, write)``: this thread is to write it, and must end with :func:`_done_writing` (after
    :func:`_add` on success)."""
    while True:
        with _lock:
            hit = next((e for e in _entries if _same_data(e, app_id, parent_url, df, inputs)), None)
            if hit is not None:
                _entries.remove(hit)  # most recently used last
                _entries.append(hit)
                _hold(held, hit.handle.cache_dir_url)  # before the lock is let go: no clear_cache in between
                return hit, None
            # The same data being written by another thread right now (CrossValidator's parallel fits of one
            # fold): wait for that write and use it rather than writing the same data twice.
            writing = next((w for w in _writing if _same_data(w, app_id, parent_url, df, inputs)), None)
            if writing is None:
                mine = _Write(app_id, parent_url, df, inputs, threading.Event())
                _writing.append(mine)
                return None, mine
        writing.done.wait()


def _add(entry: _Entry, held: List[str]) -> None:
    """Keep a cache just written (the most recently used), held for the caller."""
    with _lock:
        _entries.append(entry)
        _hold(held, entry.handle.cache_dir_url)


def _done_writing(write: _Write) -> None:
    """End a write :func:`_find_or_claim` handed out, written or failed: the threads waiting for it look again."""
    with _lock:
        _writing.remove(write)
    write.done.set()


@contextlib.contextmanager
def in_use(handles: Iterable[DatasetHandle]):
    """Keep these handles' caches while a run reads them: from eviction (another thread's prepare_datasets
    may go past MAX_CACHED_DATASETS meanwhile) and from another thread's :func:`clear_cache`."""
    held: List[str] = []
    for handle in handles:
        _hold(held, handle.cache_dir_url)
    try:
        yield
    finally:
        _release(held)


def not_evicted(handles: Dict[str, DatasetHandle]):
    """A context in which the handles' caches are not evicted (while ranks read them); nothing without any."""
    return in_use(handles.values()) if handles else contextlib.nullcontext()


def _evict(app_id: str, keep) -> None:
    """Delete the least recently used caches of ``app_id`` beyond :data:`MAX_CACHED_DATASETS`."""
    with _lock:
        mine = [e for e in _entries if e.app_id == app_id]
        extra = len(mine) - MAX_CACHED_DATASETS
        gone = [e for e in mine if e.handle.cache_dir_url not in keep
                and e.handle.cache_dir_url not in _in_use][:max(extra, 0)]
        _entries[:] = [e for e in _entries if e not in gone]
    for entry in gone:
        _delete(entry)


def _delete(entry: _Entry) -> None:
    if not entry.owned:
        return
    try:
        url = entry.converter.cache_dir_url
        directory = local_path(url)
        if session.is_connect(entry.df.sparkSession) and (directory is None or not os.path.isdir(directory)):
            _delete_on_executor(entry.df.sparkSession, url)  # the cluster's file system, not this client's
        else:
            entry.converter.delete()  # also drops it from Petastorm's own list, so Petastorm will not reuse it
    except Exception as exc:  # noqa: BLE001 -- cleanup is best effort; say what is left behind
        logger.warning("spark_dist: could not delete the dataset cache %s: %r", entry.converter.cache_dir_url, exc)


def _delete_on_executor(spark, url: str) -> None:
    """Delete the cache directory ``url`` from one executor task (under Spark Connect with a remote driver)."""
    def delete(_index):
        delete_dir(url, ignore_errors=True)
        return []

    session.run_on_executors(spark, 1, delete)


def clear_cache(spark=None) -> int:
    """Delete the dataset caches this process made (all of them, or only ``spark``'s application's), except
    those in use: being written or handed out by a ``prepare_datasets`` call under way in another thread, or
    read by a run (they are kept, and named in a warning; a later call deletes them).

    Caches the user made (their own conf's parent dir, a Petastorm cache made before) are never touched.
    Also runs when the SparkContext stops and when the interpreter exits. Returns how many were deleted;
    never raises for a cache that cannot be deleted (it logs a warning naming it).
    """
    return _clear(_app_id(spark) if spark is not None else None, keep_in_use=True)


def _clear(app_id: Optional[str], keep_in_use: bool) -> int:
    if os.getpid() != _owner_pid:
        return 0
    with _lock:
        mine = [e for e in _entries if app_id is None or e.app_id == app_id]
        gone = [e for e in mine if not keep_in_use or e.handle.cache_dir_url not in _in_use]
        _entries[:] = [e for e in _entries if e not in gone]
        kept = [e.handle.cache_dir_url for e in mine if e not in gone]
        writing = sum(app_id is None or w.app_id == app_id for w in _writing) if keep_in_use else 0
    for entry in gone:
        _delete(entry)
    with _lock:  # a prepare_datasets call takes the lock before it asks for the dir (see preparing)
        if not _entries and (not keep_in_use or not (_writing or _preparing)):
            _remove_default_parent()
    if kept or writing:
        left = [f"{len(kept)} in use ({', '.join(kept)})"] * bool(kept) + [f"{writing} being written"] * bool(writing)
        logger.warning("spark_dist: clear_cache left %s by a run or a prepare_datasets call of another thread; "
                       "call it again once those have returned", " and ".join(left))
    return sum(e.owned for e in gone)


def _clear_at_exit() -> None:
    """At interpreter exit every cache goes, in use or not: no run or write of this process outlives it."""
    _clear(None, keep_in_use=False)


def _stop_after_clearing(original_stop, app_id: str) -> None:
    try:
        with _lock:
            gone = [e for e in _entries if e.app_id == app_id]
            _entries[:] = [e for e in _entries if e.app_id != app_id]
        for entry in gone:
            _delete(entry)
    finally:
        original_stop()


def _register_cleanup(spark) -> None:
    """Delete the caches when the SparkContext stops (under Spark Connect: when this client session stops)
    and at interpreter exit, so they never pile up.

    PySpark has no stop hook, so the context's ``stop`` is wrapped (once) on this instance only.
    """
    global _atexit_registered
    sc = spark if session.is_connect(spark) else spark.sparkContext
    with _lock:
        if not _atexit_registered:
            atexit.register(_clear_at_exit)
            _atexit_registered = True
        if not getattr(sc, "_spark_dist_clears_cache", False):
            sc.stop = functools.partial(_stop_after_clearing, sc.stop, session.app_id(spark))
            sc._spark_dist_clears_cache = True
