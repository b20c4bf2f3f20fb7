"""Leftovers of killed processes: temp dirs of dead owners are swept, a rank's own children end with it."""
import os
import subprocess
import time

from spark_dist import Distributor, tempdirs


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


def start_a_helper_and_return():
    import subprocess

    from spark_dist import get_context

    helper = subprocess.Popen(["sleep", "300"])  # e.g. a server or loader worker the user forgot to stop
    return {get_context().rank: helper.pid}


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_ranks_children_end_when_it_returns(spark_local):
    pid = Distributor(num_processes=2, verbose=False).run(start_a_helper_and_return)[0]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)
    assert not _running(pid)
