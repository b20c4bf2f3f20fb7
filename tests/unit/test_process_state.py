"""spark_dist.host.process_state: a stopped process is told apart from a running or a gone one."""
import os
import signal
import subprocess
import sys

from spark_dist.host.process_state import stopped


def test_a_process_is_stopped_only_between_sigstop_and_sigcont():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not stopped(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        assert _soon(lambda: stopped(proc.pid))
        os.kill(proc.pid, signal.SIGCONT)
        assert _soon(lambda: not stopped(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert not stopped(proc.pid)  # gone: nothing to say


def _soon(condition, tries=200):
    import time

    for _ in range(tries):
        if condition():
            return True
        time.sleep(0.01)
    return False
