"""How long a training step is stalled by a checkpoint of a ~100M-parameter model on 2 CPU ranks, the bytes each
rank writes and rank 0's peak memory during the save: rank 0's ``torch.save`` against sharded saves (a script,
not a test).

    python bench/bench_checkpoints.py [--layers 6] [--width 4096] [--rounds 3] [--out FILE]

Two ranks (processes over gloo, each with the ``TrainContext`` a run gives it; no Spark: the saves are the
same in a run), the model ``--layers`` Linear(width, width) layers sharded with FSDP2's ``fully_shard``, Adam.
After a training step, each way saves model and optimizer, ``--rounds`` times (the median):

  rank0        what a user of FSDP does for one file: ``get_model_state_dict`` / ``get_optimizer_state_dict``
               with ``full_state_dict=True, cpu_offload=True`` (gathered to rank 0), then
               ``ctx.save_checkpoint(state)``: rank 0 writes it with ``torch.save``
  sharded      ``ctx.save_checkpoint({"model": model, "optimizer": optimizer})``: every rank its own shards
  async        the same with ``async_save=True``: the stall is the staging to CPU memory; the write goes on in
               the background (its time to completion reported apart)

The stall: the slowest rank's time in the call. Bytes: the files each rank wrote. Memory: rank 0's peak RSS
during the call (and, async, until the write completed) over its RSS before, sampled every 5 ms, against its
own shard of the state (model and optimizer) and the largest single tensor shard (one bucket).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)


def peak_rss_during(fn):
    """``(fn's result, peak RSS growth in bytes over the RSS before)`` of this process, sampled every 5 ms."""
    import psutil

    me = psutil.Process()
    before = me.memory_info().rss
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, max(peak[0], me.memory_info().rss) - before


def rank_main(rank, world_size, port, directory, layers, width, rounds, out):
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from spark_dist.task.context import TrainContext

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad()
        model(torch.randn(4, width)).pow(2).mean().backward()
        optimizer.step()

    step()
    own = sum(t.to_local().numel() * t.element_size() for t in model.parameters()) * 3  # weights + Adam's two
    bucket = max(t.to_local().numel() * t.element_size() for t in model.parameters())
    params = sum(p.numel() for p in model.parameters())
    figures = {}
    for way in ("rank0", "sharded", "async"):
        ctx = TrainContext(rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size,
                           node_rank=0, attempt=0, run_id=way, host="localhost",
                           checkpoint_dir=os.path.join(directory, way))
        stalls, completes, growths = [], [], []
        for _ in range(rounds):
            step()
            dist.barrier()

            def save():
                started = time.perf_counter()
                if way == "rank0":
                    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
                    state = {"model": get_model_state_dict(model, options=options),
                             "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
                    ctx.save_checkpoint(state)
                else:
                    ctx.save_checkpoint({"model": model, "optimizer": optimizer}, async_save=way == "async")
                stall = time.perf_counter() - started
                ctx.wait_for_checkpoints()
                return stall, time.perf_counter() - started

            (stall, complete), growth = peak_rss_during(save)
            slowest = [None] * world_size
            dist.all_gather_object(slowest, stall)
            stalls.append(max(slowest))
            completes.append(complete)
            growths.append(growth)
        written = ctx.checkpoint_dir
        figures[way] = {"stall_seconds": stalls, "stall_median": statistics.median(stalls),
                        "complete_median": statistics.median(completes), "rank0_growth_bytes": max(growths),
                        "bytes_by_rank": bytes_by_rank(written, world_size)}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"figures": figures, "parameters": params, "own_shard_bytes": own, "bucket_bytes": bucket}, f)
    dist.destroy_process_group()


def bytes_by_rank(directory: str, world_size: int) -> list:
    """The bytes of each rank's files in a run's checkpoint directory (the latest save): rank 0's
    ``checkpoint.pt``, or each rank's ``__<rank>_<n>.distcp`` (DCP's ``.metadata`` counts to rank 0)."""
    sizes = [0] * world_size
    flat = os.path.join(directory, "checkpoint.pt")
    if os.path.exists(flat):
        sizes[0] = os.path.getsize(flat)
        return sizes
    latest = os.path.join(directory, "sharded", max(os.listdir(os.path.join(directory, "sharded"))))
    for name in os.listdir(latest):
        path = os.path.join(latest, name)
        if name.startswith("__") and name.endswith(".distcp"):
            sizes[int(name[2:].split("_")[0])] += os.path.getsize(path)
        elif name == ".metadata":
            sizes[0] += os.path.getsize(path)
    return sizes


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    from tests.free_ports import free_ports

    t_start, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_checkpoints-") as tmp:
        out = os.path.join(tmp, "figures.json")
        mp.start_processes(rank_main, args=(2, free_ports(1), os.path.join(tmp, "runs"), args.layers, args.width,
                                            args.rounds, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            measured = json.load(f)
    figures = measured["figures"]
    report = {"date": time.strftime("%Y-%m-%d"), "config": vars(args) | {"ranks": 2},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
              **measured, "async_stall_vs_rank0": figures["async"]["stall_median"] / figures["rank0"]["stall_median"],
              "sharded_stall_vs_rank0": figures["sharded"]["stall_median"] / figures["rank0"]["stall_median"],
              "seconds": time.perf_counter() - t_start, "load_average": [load_before, os.getloadavg()[0]]}
    for way, f in figures.items():
        print(f"{way}: stall {f['stall_median']:.2f} s (complete {f['complete_median']:.2f} s), bytes by rank "
              f"{[round(b / 2**20) for b in f['bytes_by_rank']]} MiB, rank 0 grew {f['rank0_growth_bytes'] / 2**20:.0f} "
              f"MiB", flush=True)
    print(f"{measured['parameters'] / 1e6:.1f}M parameters; rank 0's own shard {measured['own_shard_bytes'] / 2**20:.0f}"
          f" MiB, one bucket {measured['bucket_bytes'] / 2**20:.0f} MiB; async / rank0 stall "
          f"{report['async_stall_vs_rank0']:.3f}x", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
