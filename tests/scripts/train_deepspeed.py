"""A tiny MLP trained with DeepSpeed (the ZeRO stage its config names) on every rank, with a save and a resume
of DeepSpeed's own checkpoint (``engine.save_checkpoint`` / ``load_checkpoint``).

As a function (``train``), run by ``spark_dist.DeepspeedTorchDistributor``: the config comes from
``get_context().deepspeed_config``. As a script, it takes the arguments PySpark's DeepspeedTorchDistributor
passes (``--deepspeed --deepspeed_config FILE``, read with ``deepspeed.add_config_arguments``), and runs as
well outside spark_dist (PySpark's distributor, torchrun)::

    torchrun --nproc_per_node=2 train_deepspeed.py --checkpoint_dir DIR --record_dir OUT --deepspeed \
        --deepspeed_config ds.json

and trains twice in one process: 6 steps with a checkpoint after step 4, then a fresh engine that resumes from
that checkpoint and trains steps 5 and 6 again; rank 0 writes both runs' losses to ``OUT/result.json``.

The optimizer is torch's Adam passed in as the client optimizer: DeepSpeed's own CPU Adam is a C++ op it
would compile first.
"""
import argparse
import json
import os
import sys


def batch(step, rank):
    """The same inputs for a (step, rank) in every run: a resumed run sees what the first one saw."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(4, 8, generator=g)
    return x, x.sum(1, keepdim=True)


def own_extension_cache():
    """Give this Python environment its own cache of the C++ ops torch compiles on first use (DeepSpeed's
    shared-memory all-reduce on CPU), inside the environment: by default every environment of a user shares
    one per Python version, so two environments (the two Spark lines' tests, run at once) would rebuild and
    replace the op under each other. ``scripts/setup_env.sh`` compiles the op there as it builds the
    environment. A ``TORCH_EXTENSIONS_DIR`` already set is kept."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def private_dirs(path):
    """Make ``path`` and its missing parents owner-only: DeepSpeed's checkpoints are unpickled on load, and
    spark_dist refuses a run directory others can write (``os.makedirs``' mode covers only the last one)."""
    old = os.umask(0o077)
    try:
        os.makedirs(path, exist_ok=True)
    finally:
        os.umask(old)


def train(config=None, checkpoint_dir=None, record_dir=None, steps=8, save_at=4, fail_at=None):
    """Train ``steps`` steps from the latest checkpoint in ``checkpoint_dir`` (default: under the run's
    ``ctx.checkpoint_dir``, which a retry of the run finds again), saving one after step ``save_at``. With
    ``fail_at``, the first attempt's last rank dies after that step (rank 0 first writes its losses into
    ``record_dir/attempt0.json``): a lost process, which spark_dist retries whatever the number of ranks (an
    exception that every rank raised alike, as one rank alone would, it does not). Returns this rank's
    ``{"stage", "start", "attempt", "losses": {step: loss}}``."""
    own_extension_cache()
    import deepspeed
    import torch
    import torch.distributed as dist

    import spark_dist

    try:
        ctx = spark_dist.get_context()
        rank, world_size, attempt = ctx.rank, ctx.world_size, ctx.attempt
    except RuntimeError:  # outside spark_dist: torchrun's variables, and no retries
        ctx, rank, world_size, attempt = None, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0
    config = ctx.deepspeed_config if config is None else config
    ckpt = checkpoint_dir or os.path.join(ctx.checkpoint_dir, "deepspeed")
    private_dirs(ckpt)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    start = 0
    if os.path.exists(os.path.join(ckpt, "latest")):
        _, client_state = engine.load_checkpoint(ckpt)
        start = client_state["step"]
    losses = {}
    for step in range(start, steps):
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses[step] = loss.item()
        if step + 1 == save_at:
            engine.save_checkpoint(ckpt, client_state={"step": step + 1})
        if fail_at is not None and attempt == 0 and step + 1 == fail_at:
            if rank == 0 and record_dir:
                with open(os.path.join(record_dir, "attempt0.json"), "w") as f:
                    json.dump(losses, f)
            dist.barrier()  # rank 0's record is written before the last rank fails
            if rank == world_size - 1:
                print(f"injected failure after step {step + 1}", flush=True)
                os._exit(17)
    return {"stage": engine.zero_optimization_stage(), "start": start, "attempt": attempt, "losses": losses}


def main():
    import deepspeed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--record_dir", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    assert args.deepspeed and args.deepspeed_config, sys.argv
    first = train(args.deepspeed_config, args.checkpoint_dir, steps=6, save_at=4)
    resumed = train(args.deepspeed_config, args.checkpoint_dir, steps=6, save_at=None)
    if int(os.environ["RANK"]) == 0:
        with open(os.path.join(args.record_dir, "result.json"), "w") as f:
            json.dump({"argv": sys.argv[1:], "first": first, "resumed": resumed}, f)
    # Leave together, the process group torn down in step: a rank tearing down gloo at exit after its peer
    # had gone aborted once ("terminate called without an active exception", SIGABRT, in a fresh-clone suite).
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
