"""spark_dist.task.teardown: a rank keeps the process groups it destroys referenced until it exits, so torch's gloo
destructor (which joins its threads holding the GIL, and could hang the rank) never runs in a rank.

The hang itself is a race that a test cannot make happen on demand (BENCHMARKS.md, Spark ML), so these tests check
what prevents it: the groups stay referenced, through both ways the rank may meet torch.distributed."""
import subprocess
import sys
import textwrap

from spark_dist import Distributor


def ddp_then_destroy():
    """What the estimator's ranks do at the end: DDP trains, the group is destroyed, the model freed."""
    import torch
    import torch.distributed as dist

    from spark_dist.task import teardown

    dist.init_process_group("gloo")
    world = dist.group.WORLD
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()
    dist.destroy_process_group()
    del model
    return [g is world for g in teardown._kept]


def test_a_spark_rank_keeps_the_groups_it_destroys(spark_local):
    assert Distributor(num_processes=2, verbose=False).run(ddp_then_destroy) == [True]


def test_a_local_mode_rank_keeps_the_groups_it_destroys(spark_local):
    assert Distributor(num_processes=2, local_mode=True, verbose=False).run(ddp_then_destroy) == [True]
