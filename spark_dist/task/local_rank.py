"""Entry of a local-mode rank process: ``python -m spark_dist.task.local_rank LAUNCH_FILE``."""
import os
import pickle
import sys
import threading

from ..host.parent_death import die_with_parent
from .rank_process import child_main, exit_rank

if __name__ == "__main__":
    die_with_parent()
    if os.getppid() != int(sys.argv[2]):  # the driver died before we could ask to die with it
        sys.exit(70)
    with open(sys.argv[1], "rb") as f:
        spec, rank, env, workdir = pickle.load(f)
    os.unlink(sys.argv[1])  # it holds the run's secret: read once, then gone
    code = child_main(spec, rank, env, workdir)
    threading._shutdown()  # the rank's own threads finish first, as they did when this ended with sys.exit
    exit_rank(code)  # then as a forked rank exits: no interpreter teardown
