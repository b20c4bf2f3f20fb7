"""Ranks without Spark: ``run_ranks`` spawns processes joined over gloo, each with the TrainContext a run would
give it, and runs one scenario in each; for the unit tests of what ranks do together (checkpoints, keep-best)."""
import os

import torch
import torch.multiprocessing as mp

from spark_dist.task.context import TrainContext
from tests.free_ports import free_ports


def _rank(rank, world_size, port, directory, scenario, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    reports = []
    ctx = TrainContext(rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size, node_rank=0,
                       attempt=0, run_id="r", host="h", checkpoint_dir=directory, _reporter=reports.append)
    result = scenario(ctx)
    ctx.wait_for_checkpoints()  # what a rank does when the training function returns
    torch.save({"result": result, "reports": reports}, f"{out}.{rank}")
    # Every rank is done, then each leaves without tearing gloo down, as a spark_dist rank does (exit_rank): a
    # rank whose peer had already exited could abort (SIGABRT) in gloo's teardown.
    dist.barrier()
    os._exit(0)


def run_ranks(world_size, directory, scenario, tmp_path):
    """``scenario(ctx)`` in each of ``world_size`` spawned ranks, checkpoints under ``directory``; a list of each
    rank's ``{"result": its return, "reports": what it reported}``. Raises ``ProcessException`` when a rank
    fails."""
    out = str(tmp_path / f"out-{world_size}-{scenario.__name__}")
    mp.start_processes(_rank, args=(world_size, free_ports(1), directory, scenario, out), nprocs=world_size,
                       start_method="spawn")
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world_size)]
