"""A torchrun-style script that only records where it ran: rank, world size and the GPU it was given.

    spark-dist run --num-processes 2 --use-gpu report_env.py OUT_DIR

Each rank writes OUT_DIR/rank<RANK>.json.
"""
import json
import os
import sys

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES")

if __name__ == "__main__":
    out_dir = sys.argv[1]
    record = {k: os.environ.get(k) for k in KEYS}
    with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(record, f)
