"""Entry of a local-mode rank process: ``python -m spark_dist._rank_main LAUNCH_FILE``."""
import os
import pickle
import sys

from .worker import child_main

if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        spec, rank, env, workdir = pickle.load(f)
    os.unlink(sys.argv[1])  # it holds the run's secret: read once, then gone
    sys.exit(child_main(spec, rank, env, workdir))
