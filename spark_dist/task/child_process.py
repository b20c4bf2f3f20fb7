"""Starting a rank's process: :class:`ChildProcess` and the two ways to make one. A Spark task *forks* it from the
reused Python worker, where torch is already imported (a fresh ``import torch`` takes seconds); a worker that has
initialised CUDA, and local mode (the driver is no place to fork from), spawn a fresh interpreter. The child leads
its own process group and dies with its parent (PR_SET_PDEATHSIG); its stdout and stderr are pipes the supervisor
(:mod:`spark_dist.task.barrier_task`) reads.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import traceback
from typing import Dict, Optional

from ..host.parent_death import die_with_parent
from ..wire.protocol import LaunchSpec
from ..wire.ranks import RankInfo
from .rank_process import child_main, exit_rank
from .warm_imports import warmed


class ChildProcess:
    """A rank process: pid, a way to wait for its exit code (negative = killed by that signal), and the
    read ends of its stdout and stderr."""

    def __init__(self, pid: int, stdout_fd: int, stderr_fd: int, popen: Optional[subprocess.Popen] = None):
        self.pid = pid
        self.stdout_fd, self.stderr_fd = stdout_fd, stderr_fd
        self._popen = popen

    def wait(self) -> int:
        if self._popen is not None:
            return self._popen.wait()
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the child leads its own group: its helpers go too
        except ProcessLookupError:  # a child just forked may not lead its group yet: it alone, then
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reap(self) -> None:
        """Wait for the (killed) child and close its pipes: nothing of it is left in this process."""
        try:
            self.wait()
        except ChildProcessError:  # already reaped
            pass
        for fd in (self.stdout_fd, self.stderr_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _unsafe_to_fork() -> bool:
    """A forked rank cannot use CUDA once this worker has initialised it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 -- a torch without CUDA support
        return False


def fork_child(spec: LaunchSpec, rank: RankInfo, env: Dict[str, str], workdir: str) -> ChildProcess:
    """Fork the rank from this (warm) Python worker; spawn it instead where forking is unsafe: this worker
    has initialised CUDA (a GPU ``transform`` ran here, say)."""
    warmed()
    if _unsafe_to_fork():
        return spawn_child(spec, rank, env, workdir)
    sys.stdout.flush()
    sys.stderr.flush()
    out_read, out_write = os.pipe()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 70
        try:
            os.close(read_fd)
            os.close(out_read)
            os.setpgid(0, 0)
            die_with_parent()
            os.dup2(out_write, 1)
            os.dup2(write_fd, 2)
            os.close(write_fd)
            os.close(out_write)
            # A pipe makes Python buffer stdout by blocks: line by line, so a SIGKILL loses no printed line.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.reconfigure(line_buffering=True)
                except (AttributeError, ValueError):  # not a TextIOWrapper here
                    pass
            atexit._clear()  # the Python worker's exit handlers are not the rank's to run
            code = child_main(spec, rank, env, workdir)
        except BaseException:
            traceback.print_exc()
        finally:
            exit_rank(code)
    os.close(write_fd)
    os.close(out_write)
    return ChildProcess(pid, out_read, read_fd)


def spawn_child(spec: LaunchSpec, rank: RankInfo, env: Dict[str, str], workdir: str) -> ChildProcess:
    """Start the rank as a fresh interpreter (local mode: the driver is no place to fork from)."""
    payload = os.path.join(workdir, "launch.pkl")
    with open(os.open(payload, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        pickle.dump((spec, rank, env, workdir), f)
    # No preexec_fn (unsafe with the driver's threads): the child sets its parent-death signal itself.
    # sys.path, not only PYTHONPATH: inside an executor Spark puts --py-files and addPyFile zips (maybe
    # spark_dist itself, and the user's modules) on sys.path at run time.
    python_path = os.pathsep.join(p for p in sys.path if p)
    popen = subprocess.Popen(
        [sys.executable, "-m", "spark_dist.task.local_rank", payload, str(os.getpid())],
        env={**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    stdout_fd, stderr_fd = os.dup(popen.stdout.fileno()), os.dup(popen.stderr.fileno())
    popen.stdout.close()
    popen.stderr.close()
    return ChildProcess(popen.pid, stdout_fd, stderr_fd, popen)
