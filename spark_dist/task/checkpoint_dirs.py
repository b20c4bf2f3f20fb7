"""Where a run's checkpoints live, and the checks a rank makes before it writes or unpickles one.

Checkpoints are written with ``torch.save`` and read with ``torch.load(weights_only=False)``, which unpickles:
whoever can write a checkpoint, or the directory that holds it, can run code in every rank that resumes. So a
rank writes or reads one only where nobody but its own uid can write, checked by the rank itself each time
(what the driver sees at a path says nothing about an executor's disk):

- the run's directory and the checkpoint file are owned by the rank's uid, not writable by group or others,
  and not symbolic links: each is opened with ``O_NOFOLLOW`` and checked with ``fstat`` on the open
  descriptor, so what was checked is what gets used (:mod:`spark_dist.host.ownership`, the one check that
  sharded checkpoints and ``read_checkpoint`` make too);
- no directory above it may be writable by others, unless sticky and root's or ours (as ``/tmp``);
- the default directory's parent, ``<temp dir>/spark_dist-<uid>``, is owner-only (0700) as well.

A directory given with ``spark.dist.checkpointDir`` (``checkpoint_dir=``) reaches the ranks as the absolute
``<dir>/<run_id>``; the permissions of ``<dir>`` itself (often a shared filesystem's) are the user's to set,
writable by a group if they choose, never by everyone.
The default reaches them as a *name*, ``<run_id>-<token>`` (relative, which a given directory never is), that
each rank places under its own host's ``<temp dir>/spark_dist-<uid>/``. The token is random when spark_dist
drew the run_id: no two runs share a directory, and the run's retries (same name) resume. When the user gave
the run_id, the token is derived from it, so running that run_id again on the same machine resumes it; the
private parent is what keeps others out, not the name. Once a run with a drawn run_id succeeded, each host
removes its copy (:func:`remove_after_success`); a named run keeps its checkpoints, to be resumed.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
from typing import IO, Iterator, Optional

from ..config import CONF_CHECKPOINT_DIR
from ..errors import ConfigError, DiskFullError
from ..host import disk_space, ownership

log = logging.getLogger(__name__)

SUCCESS_WAIT_S = 5.0  # a host waits this long for the run's success before removing its checkpoints
_FIX = f"set {CONF_CHECKPOINT_DIR} (or checkpoint_dir=) to a directory only you can write"


class CheckpointDirError(ownership.NotOwnedError):
    """A checkpoint directory or file that someone other than the rank's user could write or swap, or a symbolic
    link: spark_dist neither writes checkpoints there nor unpickles them. A ``PermissionError``; its message
    names the path, what is wrong with it, and (``fix``) what to change."""

    def __init__(self, path: str, problem: str, lead: str = "", fix: str = _FIX):
        super().__init__(path, problem)
        self.args = (f"{lead}spark_dist: the checkpoint path {path} is {problem}, so it is not this user's alone. "
                     "Checkpoints are unpickled, so whoever can write there could run code in every process that "
                     f"reads them: {fix}, or fix or remove {path}",)
        self.lead, self.fix = lead, fix

    def __reduce__(self):
        return type(self), (self.path, self.problem, self.lead, self.fix)


@contextlib.contextmanager
def explained() -> Iterator[None]:
    """Raise what :mod:`spark_dist.host.ownership` refuses as a :class:`CheckpointDirError`, which says what to
    change."""
    try:
        yield
    except CheckpointDirError:
        raise
    except ownership.NotOwnedError as exc:
        raise CheckpointDirError(exc.path, exc.problem) from None


def default_name(run_id: str, named: bool) -> str:
    """The name of a run's default directory under each host's private temp dir: ``<run_id>-<token>``, the
    token random for a drawn run_id, derived from a ``named`` one (so that naming it again resumes)."""
    if named:
        token = hashlib.sha256(f"spark_dist-run:{run_id}".encode()).hexdigest()[:16]
    else:
        token = secrets.token_hex(8)
    return f"{run_id}-{token}"


def removed_after_success(config) -> bool:
    """Whether a run's checkpoints (a :class:`~spark_dist.config.RunConfig`'s) go to its own default directory,
    which every host removes once the run succeeded: not a given directory (never removed), nor a named run's
    (kept, to be resumed)."""
    return config.checkpoint_dir is None and not config.resume


def is_default(checkpoint_dir: str) -> bool:
    """Whether ``checkpoint_dir`` (as a rank gets it) names the default directory: a given one is absolute."""
    return not os.path.isabs(checkpoint_dir)


def private_root() -> str:
    """This host's ``<temp dir>/spark_dist-<uid>``, the parent of the default directories of this user's runs."""
    return os.path.join(tempfile.gettempdir(), f"spark_dist-{os.getuid()}")


def resolve(checkpoint_dir: str) -> str:
    """The absolute path of ``checkpoint_dir`` on this host: a given one as is, the default under
    :func:`private_root`.

    Raises:
        ValueError: a default name that is not a single path component.
    """
    if not is_default(checkpoint_dir):
        return checkpoint_dir
    if not checkpoint_dir or os.sep in checkpoint_dir or checkpoint_dir in (".", ".."):
        raise ValueError(f"not a checkpoint directory name: {checkpoint_dir!r}")
    return os.path.join(private_root(), checkpoint_dir)


def check_dir(checkpoint_dir: str, create: bool = True) -> bool:
    """Check (and with ``create`` make, owner-only) the run's checkpoint directory; False if it does not exist.

    Raises:
        CheckpointDirError: it (or the default's parent) is not this user's alone, naming the conf key.
        OSError: it cannot be made or opened.
    """
    fd = open_run_dir(checkpoint_dir, create)
    if fd is None:
        return False
    os.close(fd)
    return True


@contextlib.contextmanager
def atomic_write(checkpoint_dir: str, name: str, previous: Optional[str] = None) -> Iterator[IO[bytes]]:
    """A file to write checkpoint ``name`` into the run's directory (made and checked first). On a clean exit
    it is synced and renamed over ``name`` at once: a crash mid-write never leaves a torn checkpoint. With
    ``previous``, the checkpoint it replaces stays under that name (a second link to it, made before the
    rename: ``name`` is never missing).

    Raises:
        CheckpointDirError: the directory (or the default's parent) is not this user's alone.
        DiskFullError: its filesystem is full (the file before it stays as it was).
    """
    dir_fd = open_run_dir(checkpoint_dir, create=True)
    tmp = f"{name}.tmp-{os.getpid()}"
    try:
        path = os.path.join(resolve(checkpoint_dir), tmp)
        fd = _open_at(dir_fd, tmp, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(fd, "wb") as f:
            _check(fd, path, want_dir=False)
            yield f
            f.flush()
            os.fsync(fd)
        if previous is not None:
            _link_previous(dir_fd, name, previous)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)  # the rename itself survives a crash of the host
    except BaseException as exc:
        full = disk_space.ran_out_of_space(exc, dir_fd)  # asked before the partial file frees its space
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        if full:
            raise DiskFullError(resolve(checkpoint_dir), f"checkpoint {name}", disk_space.free_bytes(dir_fd)) \
                from exc
        raise
    finally:
        os.close(dir_fd)


def _link_previous(dir_fd: int, name: str, previous: str) -> None:
    """``previous`` becomes a second link to the file ``name`` holds now, if any (the link made aside, then
    renamed over ``previous``: each name always holds a whole checkpoint)."""
    aside = f"{previous}.tmp-{os.getpid()}"
    try:
        os.link(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    try:
        os.replace(aside, previous, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(aside, dir_fd=dir_fd)
        raise


def open_checked(checkpoint_dir: str, name: str) -> Optional[IO[bytes]]:
    """Checkpoint ``name`` of the run opened for reading once it and its directory passed the checks; ``None``
    when there is none.

    Raises:
        CheckpointDirError: the file, its directory or the default's parent is not this user's alone.
    """
    dir_fd = open_run_dir(checkpoint_dir, create=False)
    if dir_fd is None:
        return None
    path = os.path.join(resolve(checkpoint_dir), name)
    try:
        try:  # O_NONBLOCK: a FIFO in its place must not block the open (the check refuses it)
            fd = _open_at(dir_fd, name, path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
    finally:
        os.close(dir_fd)
    f = open(fd, "rb")
    try:
        _check(fd, path, want_dir=False)
    except BaseException:
        f.close()
        raise
    return f


def remove(checkpoint_dir: str) -> bool:
    """Remove this host's copy of a default checkpoint directory, once its parent proved ours; a given
    directory is never removed. Returns whether something was removed; never raises (logs instead)."""
    if not is_default(checkpoint_dir):
        return False
    try:
        with explained():
            root = ownership.open_dir(private_root(), private=True)
        if root is None:
            return False
        os.close(root)
        # Nobody else can write the checked parent, so the name cannot be swapped; rmtree never follows links.
        shutil.rmtree(resolve(checkpoint_dir))
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("spark_dist: could not remove the run's checkpoint directory: %s", exc)
        return False
    return True


def remove_after_success(spec, store, outcomes) -> bool:
    """In a task whose ranks all ended well: wait (at most :data:`SUCCESS_WAIT_S`) for the driver to say how the
    whole run ended (the store wakes the waiter), and once it succeeded remove this host's copy of the run's
    default checkpoint directory. Until then a rank elsewhere may still fail, and its retry resume from these
    checkpoints. Never raises."""
    from ..wire.protocol import RUN_SUCCEEDED, TaskOutcome

    if not spec.remove_checkpoint_dir or not spec.checkpoint_dir or any(o is not TaskOutcome.OK for o in outcomes):
        return False
    try:
        if not os.path.isdir(resolve(spec.checkpoint_dir)):
            return False  # no rank checkpointed on this host: nothing to wait for
        if not store.wait_for(RUN_SUCCEEDED, SUCCESS_WAIT_S):
            return False  # the run failed elsewhere: its retry resumes from here
    except Exception as exc:  # noqa: BLE001 -- a leftover directory must not fail a run that succeeded
        log.warning("spark_dist: checkpoints of run %s left in %s: %s", spec.run_id,
                    resolve(spec.checkpoint_dir), exc)
        return False
    return remove(spec.checkpoint_dir)


# ------------------------------------------------------------------------------------------------------------
def open_run_dir(checkpoint_dir: str, create: bool = False) -> Optional[int]:
    """A checked descriptor of the run's directory (the default's parent checked first, a given one's parents
    all the way up); ``None`` when it does not exist. The caller closes it.

    Raises:
        CheckpointDirError: it, or a directory above it, is not this user's alone.
    """
    with explained():
        if not is_default(checkpoint_dir):  # a given root may not exist yet on this host: made with ``create``
            return ownership.open_dir(checkpoint_dir, create=create)
        root = ownership.open_dir(private_root(), create=create, private=True)
        if root is None:
            return None
        try:
            return ownership.open_dir(resolve(checkpoint_dir), create=create, parent_fd=root)
        finally:
            os.close(root)


def _open_at(dir_fd: int, name: str, path: str, flags: int) -> int:
    with explained():
        return ownership.open_at(dir_fd, name, path, flags)


def _check(fd: int, path: str, want_dir: bool) -> None:
    with explained():
        ownership.check(fd, path, want_dir=want_dir)


__all__ = ["CheckpointDirError", "atomic_write", "check_dir", "default_name", "explained", "is_default",
           "open_checked", "open_run_dir", "private_root", "remove", "remove_after_success",
           "removed_after_success", "resolve"]


def run_dir(config) -> str:
    """The run's checkpoint directory as its ranks get it, drawn once per run (its retries resume from it):
    ``<root>/<run_id>`` under a given root, each run its own, so a new run never resumes another's and
    naming an earlier ``run_id`` resumes it; else the default's name, which each rank places in its own
    host's private temp dir (this module also checks it there each time).

    Raises:
        ConfigError: the given root is visible here and the run's directory in it is someone else's or
            writable by others (checkpoints are unpickled), naming the key to change.
    """
    if config.checkpoint_dir is None:
        return default_name(config.run_id, named=config.resume)
    path = os.path.join(config.checkpoint_dir, config.run_id)
    try:
        check_dir(path)
    except CheckpointDirError as exc:
        raise ConfigError(f"{exc} (or use another run_id)") from None
    except OSError:  # the driver may not mount the executors' shared filesystem: the ranks make and check it
        pass
    return path
