"""spark_dist.host.tempdirs: directories held by a lock, swept once nobody holds them."""
import os
import shutil
import subprocess
import sys

from spark_dist.host import tempdirs


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_dirs_of_dead_owners_are_swept_and_others_kept(tmp_path):
    dead = tmp_path / f"spark_dist-rank-{_dead_pid()}-run1-0-r1-abcd"
    alive = tmp_path / f"spark_dist-rank-{os.getpid()}-run2-0-r0-efgh"
    other_kind = tmp_path / f"spark_dist-cache-{_dead_pid()}-ijkl"
    not_ours = tmp_path / "spark_dist-rankish"
    for d in (dead, alive, other_kind, not_ours):
        d.mkdir()
        (d / "result.pkl").write_bytes(b"x")
    made = tempdirs.make("rank", "run3-0-r0", parent=str(tmp_path))  # a new rank sweeps first
    assert not dead.exists()
    assert alive.exists() and other_kind.exists() and not_ours.exists()
    assert os.path.basename(made).startswith(f"spark_dist-rank-{os.getpid()}-run3-0-r0-")
    assert os.stat(made).st_mode & 0o777 == 0o700


def _hold_lock_in_another_process(directory):
    """A live process holding ``directory``'s lock, as its owner would, whatever pid the name carries (e.g. an
    owner in another PID namespace, whose pid means nothing here). Ends when its stdin closes."""
    code = ("import fcntl, os, sys\n"
            f"fd = os.open({str(directory / tempdirs.LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_held_directory_survives_whatever_its_pid_and_goes_once_released(tmp_path):
    held = tmp_path / f"spark_dist-rank-{_dead_pid()}-run1-0-r0-abcd"   # no such pid here; its owner lives
    held.mkdir()
    holder = _hold_lock_in_another_process(held)
    try:
        assert tempdirs.sweep("rank", str(tmp_path)) == []
        assert held.exists()
    finally:
        holder.stdin.close()  # the owner ends (as a SIGKILL would end it: the kernel drops the lock)
        holder.wait(timeout=30)
    assert tempdirs.sweep("rank", str(tmp_path)) == [str(held)]
    assert not held.exists()


def test_a_directory_nobody_holds_is_swept_even_where_its_pid_runs(tmp_path):
    # The pid in the name runs here (reused by another process, or ours), but the lock is free: the owner is gone.
    orphan = tmp_path / f"spark_dist-cache-{os.getpid()}-efgh"
    orphan.mkdir()
    (orphan / tempdirs.LOCK_NAME).write_bytes(b"")
    assert tempdirs.sweep("cache", str(tmp_path)) == [str(orphan)]


def test_a_directory_made_here_is_held_against_other_processes_sweeps(tmp_path):
    made = tempdirs.make("cache", parent=str(tmp_path))
    sweeper = [sys.executable, "-c",
               f"from spark_dist.host import tempdirs; print(tempdirs.sweep('cache', {str(tmp_path)!r}))"]
    assert subprocess.run(sweeper, capture_output=True, text=True, check=True).stdout == "[]\n"
    assert os.path.isdir(made)
    shutil.rmtree(made)
    tempdirs.release(made)
    again = tempdirs.make("cache", parent=str(tmp_path))
    tempdirs.release(again)  # unlocked, as after its owner's SIGKILL: another process's sweep removes it
    assert subprocess.run(sweeper, capture_output=True, text=True, check=True).stdout == f"[{again!r}]\n"
