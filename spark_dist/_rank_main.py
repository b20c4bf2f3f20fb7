"""Entry of a local-mode rank process: ``python -m spark_dist._rank_main LAUNCH_FILE``."""
import atexit
import os
import pickle
import sys

from .worker import _die_with_parent, child_main

if __name__ == "__main__":
    _die_with_parent()
    if os.getppid() != int(sys.argv[2]):  # the driver died before we could ask to die with it
        sys.exit(70)
    with open(sys.argv[1], "rb") as f:
        spec, rank, env, workdir = pickle.load(f)
    os.unlink(sys.argv[1])  # it holds the run's secret: read once, then gone
    code = child_main(spec, rank, env, workdir)
    # Exit as a forked rank does: the rank's own exit handlers, then no interpreter teardown, which would free
    # the process groups spark_dist.teardown keeps (and could hang in torch's gloo destructor).
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
