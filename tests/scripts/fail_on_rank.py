"""A torchrun-style script in which one rank raises: the launcher must report that rank's own error.

    spark-dist run --num-processes 2 fail_on_rank.py --rank 1

Every rank joins the process group; the chosen rank then raises ValueError in ``load_batch`` while the
others wait in a collective (they die later, as secondary failures).
"""
import argparse
import os

import torch
import torch.distributed as dist


def load_batch(rank, bad_rank):
    if rank == bad_rank:
        raise ValueError(f"corrupt record in shard {rank}")
    return torch.ones(4)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, default=1, help="the rank that fails")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group()
    batch = load_batch(rank, args.rank)
    dist.all_reduce(batch)  # the healthy ranks wait here for the one that failed
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
