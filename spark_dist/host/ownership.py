"""Whether a path is this user's alone, checked on the open descriptor that is then used.

Whoever can write a file that spark_dist unpickles (a checkpoint), or swap the directory that holds it, can run
code as this user. So such a path is opened, never through a symbolic link at its end (``O_NOFOLLOW``), and
the open descriptor is checked with ``fstat``: what was checked is what gets read. Checked:

- the path itself: of the kind wanted (a directory or a regular file), owned by this process's uid, and not
  writable by group or others (``private``: not usable by them at all);
- with an absolute path, every directory above it, walked down from ``/`` one descriptor at a time: none may
  be writable by others unless it has the sticky bit and belongs to root or to this user (as ``/tmp`` does),
  where nobody else can rename what is ours. A directory writable by its group is allowed (a team's shared
  mount is the user's choice), as is one owned by another uid (a mount's administrator): neither lets just
  anyone swap what is in it, and what is read goes through the checked descriptor anyway.

Symbolic links above the path are resolved once (``realpath``) before the walk, which then opens each resolved
component with ``O_NOFOLLOW``: a link swapped in meanwhile is refused, not followed.

Errors: :class:`NotOwnedError` (a ``PermissionError``) naming the path and what is wrong with it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Iterator, Optional

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY
# The directories above are only walked through: O_PATH needs no read permission on them (a 0711 home).
_ABOVE = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY
_PROC_FD = "/proc/self/fd"


class NotOwnedError(PermissionError):
    """A path that someone other than this user could write or swap, a symbolic link, or not of its kind."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path} is {problem}")
        self.path, self.problem = path, problem

    def __reduce__(self):
        return type(self), (self.path, self.problem)


def open_dir(path: str, *, create: bool = False, private: bool = False,
             parent_fd: Optional[int] = None) -> Optional[int]:
    """A checked descriptor of the directory ``path``; ``None`` when it does not exist. With ``parent_fd`` the
    directory is its last component inside that (already checked) descriptor; else ``path`` is absolute and
    every directory above it is checked on the way down. ``create`` makes it first, owner-only.

    Raises:
        NotOwnedError: it (or a directory above it) fails the checks.
        OSError: it cannot be made or opened.
    """
    if parent_fd is None:
        if create:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            with _parent(path) as fd:
                return open_dir(path, create=create, private=private, parent_fd=fd)
        return None
    name = os.path.basename(path)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = open_at(parent_fd, name, path, DIRECTORY)
    except FileNotFoundError:
        return None
    return _checked(fd, path, want_dir=True, private=private)


def open_file(dir_fd: int, name: str, path: str) -> Optional[int]:
    """A checked descriptor of the regular file ``name`` in the checked directory ``dir_fd``, for reading;
    ``None`` when there is none. ``path`` names it in errors.

    Raises:
        NotOwnedError: it fails the checks (a FIFO in its place too: opened without blocking, then refused).
    """
    try:
        fd = open_at(dir_fd, name, path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    return _checked(fd, path, want_dir=False)


def check_files(dir_fd: int, path: str) -> None:
    """Check every entry of the checked directory ``dir_fd`` (at ``path``): each a regular file of ours.

    Raises:
        NotOwnedError: naming the first entry that fails.
    """
    for name in sorted(os.listdir(dir_fd)):
        fd = open_file(dir_fd, name, os.path.join(path, name))
        if fd is not None:  # gone meanwhile: only we can remove it, and nothing reads it then
            os.close(fd)


def open_at(dir_fd: Optional[int], name: str, path: str, flags: int) -> int:
    """``os.open`` of ``name`` (in ``dir_fd``) never through a link at its end; ``path`` names it in errors.

    Raises:
        NotOwnedError: ``name`` is a symbolic link (or, for a directory, not one).
    """
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOwnedError(path, "a symbolic link or not a directory" if flags & os.O_DIRECTORY
                                else "a symbolic link") from None
        raise


def check(fd: int, path: str, *, want_dir: bool, private: bool = False) -> None:
    """Refuse the open ``fd`` (at ``path``) unless it is of its kind, ours, and nobody else may write it (or,
    ``private``, use it).

    Raises:
        NotOwnedError: saying which check failed.
    """
    info = os.fstat(fd)
    me = os.getuid()
    if want_dir and not stat.S_ISDIR(info.st_mode):
        raise NotOwnedError(path, "not a directory")
    if not want_dir and not stat.S_ISREG(info.st_mode):
        raise NotOwnedError(path, "not a regular file")
    if info.st_uid != me:
        raise NotOwnedError(path, f"owned by uid {info.st_uid}, not by this process's uid {me}")
    if info.st_mode & (0o077 if private else 0o022):
        need = "owner-only (chmod 700)" if private else "writable by its owner alone (chmod go-w)"
        raise NotOwnedError(path, f"of mode {stat.S_IMODE(info.st_mode):04o}, where it must be {need}")


def fd_path(fd: int, path: str) -> str:
    """A path that names the open directory ``fd`` itself, for a library that opens files by path: files
    opened under it are those of the directory checked, whatever was renamed since. ``path`` where the
    system has no ``/proc/self/fd`` (there the checked parents keep others from swapping it)."""
    return f"{_PROC_FD}/{fd}" if os.path.isdir(_PROC_FD) else path


@contextlib.contextmanager
def _parent(path: str) -> Iterator[int]:
    """A descriptor of the directory above the absolute ``path``, each directory from ``/`` down checked."""
    if not os.path.isabs(path):
        raise ValueError(f"not an absolute path: {path!r}")
    parent = os.path.realpath(os.path.dirname(path))
    fd = os.open("/", _ABOVE | os.O_CLOEXEC)
    try:
        _check_above(fd, "/", path)
        at = "/"
        for part in [p for p in parent.split(os.sep) if p]:
            at = os.path.join(at, part)
            below = open_at(fd, part, at, _ABOVE)
            os.close(fd)
            fd = below
            _check_above(fd, at, path)
        yield fd
    finally:
        os.close(fd)


def _check_above(fd: int, directory: str, path: str) -> None:
    """Refuse ``directory`` (open as ``fd``), which holds ``path``, when others could swap what is in it."""
    info = os.fstat(fd)
    if not info.st_mode & stat.S_IWOTH:
        return
    if info.st_mode & stat.S_ISVTX and info.st_uid in (0, os.getuid()):
        return
    how = (f"sticky but owned by uid {info.st_uid}" if info.st_mode & stat.S_ISVTX
           else "without the sticky bit")
    raise NotOwnedError(path, f"under {directory}, which others can write (mode {stat.S_IMODE(info.st_mode):04o}, "
                              f"{how}): they could put another in its place; chmod o-w {directory}, or use a "
                              "directory under one only you can write")


def _checked(fd: int, path: str, *, want_dir: bool, private: bool = False) -> int:
    try:
        check(fd, path, want_dir=want_dir, private=private)
    except BaseException:
        os.close(fd)
        raise
    return fd


__all__ = ["DIRECTORY", "NotOwnedError", "check", "check_files", "fd_path", "open_at", "open_dir", "open_file"]
