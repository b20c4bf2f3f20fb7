"""A process that asked to die with its parent is gone once its parent is killed."""
import os
import signal
import subprocess
import sys
import time

import psutil

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "from spark_dist.host.parent_death import die_with_parent; die_with_parent(); print('asked', flush=True); "
    "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_that_asked_to_die_with_its_parent_ends_when_the_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        assert parent.stdout.readline().strip() == "asked"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            child.kill()
        parent.stdout.close()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
