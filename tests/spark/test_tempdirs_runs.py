"""Leftovers of killed processes: temp dirs nobody holds are swept, a rank's own children end with it."""
import os
import shutil
import subprocess
import sys
import time

from spark_dist import Distributor

from spark_dist.host import tempdirs


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
