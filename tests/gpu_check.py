"""GPU check, run by hand on a machine with a CUDA GPU (not part of the suite: pytest does not collect it).

    python tests/gpu_check.py [--cpu]

It needs torch, numpy, pandas, pyarrow, cloudpickle, scikit-learn and pyspark's Python package (no JVM: the
runs are in local mode over a dataset handle written with pyarrow, so no Spark job runs). It checks, on GPU 0:

  1. the estimator's training function (DDP over NCCL on ``cuda:LOCAL_RANK``) learns the digits through our
     loader in a local-mode ``Distributor`` run with ``use_gpu=True``;
  2. a rank started from a process that has initialised CUDA is spawned, not forked, and works; a forced fork
     fails as CUDA says it must (which is why the fallback exists);
  3. ``TorchModel`` inference on the GPU predicts what it predicts on the CPU;
  4. FSDP2 (tests/scripts/train_fsdp.py: ``fully_shard`` over NCCL) trains, saves sharded checkpoints (in the
     background: staged from GPU to CPU memory), and a second run of the same ``run_id`` resumes from them;
  5. DeepSpeed ZeRO stages 2 and 3 through ``spark_dist.DeepspeedTorchDistributor`` with a resume
     (tests/gpu_check_deepspeed.py; skipped where deepspeed is not importable);
  6. a rank stalled after NCCL all-reduces is diagnosed with ``spark.dist.stallAction=fail``, and the
     diagnosis holds its NCCL Flight Recorder dump, the all-reduces in it.

``--cpu`` runs the same steps without a GPU (gloo, CPU inference; step 2's fork failure is skipped), to check
the script itself. Prints one line per check and exits non-zero if any fails.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def digits_handle(directory):
    """The digits (64 pixels as a float32 array, a long label) as one Parquet file and its handle."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    from spark_dist.data.handle import ColumnStats, describe_files

    digits = load_digits()
    pixels = (digits.data / 16.0).astype("float32")
    table = pa.table({"features": pa.array(list(pixels), type=pa.list_(pa.float32())),
                      "label": pa.array(digits.target.astype("int64"))})
    path = os.path.join(directory, "part-0.parquet")
    pq.write_table(table, path, row_group_size=256)
    handle = describe_files("train", f"file://{directory}", [f"file://{path}"],
                            {"features": "array", "label": "scalar"}, {"features": ColumnStats(length=64)})
    return handle, pixels, digits.target


def mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def train_spec(use_gpu):
    from spark_dist.ml.persistence import dumps
    from spark_dist.ml.training import TrainSpec

    return TrainSpec(objects=dumps({"model": mlp(), "loss": "cross_entropy", "optimizer": "adam"}),
                     loss="cross_entropy", feature_columns=("features",), stack_features=False,
                     label_column="label", batch_size=64, epochs=8, learning_rate=0.003, scale_learning_rate=True,
                     warmup_epochs=1.0, backend="ddp", use_gpu=use_gpu, seed=7, has_validation=False)


def check_training(handle, pixels, labels, use_gpu):
    import torch

    from spark_dist import Distributor
    from spark_dist.ml.training import train_ranks

    result = Distributor(num_processes=1, local_mode=True, use_gpu=use_gpu, verbose=False).run(
        train_ranks, train_spec(use_gpu), datasets={"train": handle})
    model = mlp()
    model.load_state_dict(result["state_dict"])
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(pixels)).argmax(1).numpy() == labels).mean()
    losses = [r["train_loss"] for r in result["history"]]
    ok = accuracy > 0.95 and losses[-1] < losses[0]
    return ok, f"training accuracy {accuracy:.3f}, loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def check_fork_after_cuda(handle, use_gpu):
    """Local mode normally spawns; make it fork (as a Spark task does) from this process, where CUDA is live."""
    import torch

    from spark_dist import Distributor, TrainingFailedError

    from spark_dist.driver import attempt as classic_launch

    from spark_dist.task import child_process as worker
    from spark_dist.ml.training import train_ranks

    if use_gpu:
        torch.zeros(1, device="cuda")  # this process initialises CUDA, as a GPU transform in a worker would
    real_spawn, real_unsafe = classic_launch.spawn_child, worker._unsafe_to_fork
    notes, ok = [], True
    try:
        classic_launch.spawn_child = worker.fork_child
        Distributor(num_processes=1, local_mode=True, use_gpu=use_gpu, verbose=False).run(
            train_ranks, train_spec(use_gpu), datasets={"train": handle})
        # On a GPU the fallback must have been taken (CUDA is live here); without one it is never taken.
        notes.append(f"spawned instead of forked: {real_unsafe()}, run ok")
        ok = real_unsafe() if use_gpu else not real_unsafe()
        if use_gpu:
            worker._unsafe_to_fork = lambda: False  # force the fork the fallback avoids
            try:
                Distributor(num_processes=1, local_mode=True, use_gpu=True, verbose=False).run(
                    train_ranks, train_spec(True), datasets={"train": handle})
                notes.append("forced fork ran: CUDA did not refuse it, so the fallback may be unneeded here")
                ok = False
            except TrainingFailedError as exc:
                refused = "re-initialize CUDA" in str(exc)
                ok = ok and refused
                notes.append(f"forced fork fails{' as CUDA says it must' if refused else ' otherwise'}: "
                             f"{str(exc).splitlines()[0][:160]}")
    finally:
        classic_launch.spawn_child, worker._unsafe_to_fork = real_spawn, real_unsafe
    return ok, "; ".join(notes)


def check_inference(pixels, use_gpu):
    import numpy as np

    from spark_dist.ml import model as model_module
    from spark_dist.ml.persistence import dumps

    payload = dumps(mlp())
    features = pixels[:1000]
    on_device = model_module.load_for_inference(payload, use_gpu)
    device = next(on_device.parameters()).device
    on_cpu = model_module.load_for_inference(payload, False)
    a = model_module.forward_rows(on_device, features)
    b = model_module.forward_rows(on_cpu, features)
    ok = (device.type == "cuda") == use_gpu and np.allclose(a, b, atol=1e-4)
    return ok, f"inference on {device}: max |gpu - cpu| = {np.abs(a - b).max():.2e}"


def regression_handle(directory):
    """tests/scripts/train_fsdp.py's "train" dataset (``x``: 4 floats, ``y``) as one Parquet file and its handle."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_dist.data.handle import ColumnStats, describe_files

    ids = np.arange(200)
    x = np.stack([np.sin(ids * k) for k in (1, 2, 3, 4)], axis=1).astype("float32")
    table = pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": pa.array(np.cos(ids))})
    path = os.path.join(directory, "regression.parquet")
    pq.write_table(table, path)
    return describe_files("train", f"file://{directory}", [f"file://{path}"], {"x": "array", "y": "scalar"},
                          {"x": ColumnStats(length=4)})


def check_fsdp(directory, use_gpu):
    from spark_dist import Distributor

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
    from train_fsdp import train

    handle = regression_handle(directory)
    runs = [Distributor(num_processes=1, local_mode=True, use_gpu=use_gpu, verbose=False, run_id="gpu-fsdp",
                        checkpoint_dir=os.path.join(directory, "fsdp")).run(
        train, epochs, batch_size=16, async_save=True, datasets={"train": handle}) for epochs in (2, 4)]
    first, resumed = runs
    losses = {**first["losses"], **resumed["losses"]}
    ok = resumed["resumed_at"] == (1, 12) and sorted(losses) == [0, 1, 2, 3] and losses[3] < losses[0]
    return ok, (f"FSDP2 on {'cuda' if use_gpu else 'cpu'}: resumed at {resumed['resumed_at']}, "
                f"loss {losses[0]:.4f} -> {losses[3]:.4f}")


def blocks_after_collectives(steps):
    """NCCL all-reduces, a step each, then the rank waits in its own code until the stall fails the run."""
    import threading

    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    ctx = get_context()
    dist.init_process_group("nccl" if ctx.use_gpu else "gloo")
    total = torch.ones(1, device=ctx.device)
    for _ in range(steps):
        dist.all_reduce(total)
        ctx.step()
    torch.cuda.synchronize() if ctx.use_gpu else None
    threading.Event().wait(600)


def check_stall(use_gpu):
    """A stalled rank on NCCL: the diagnosis carries its Flight Recorder dump, the all-reduces in it."""
    import pickle

    from spark_dist import Distributor
    from spark_dist.driver import distributor
    from spark_dist.errors import RunStalledError

    # Local mode without a session reads no Spark conf: set the two keys as a session's conf would hold them.
    distributor._spark_conf = lambda spark: {"spark.dist.stallTimeout": "5", "spark.dist.stallAction": "fail"}
    d = Distributor(num_processes=1, local_mode=True, use_gpu=use_gpu, verbose=False)
    try:
        d.run(blocks_after_collectives, 4)
        return False, "the run did not stall"
    except RunStalledError:
        pass
    [rank] = d.stalls[0].ranks
    if not use_gpu:
        return rank.nccl_trace is None, "gloo: no Flight Recorder dump, as expected"
    trace = pickle.loads(rank.nccl_trace)
    names = [entry.get("profiling_name", "") for entry in trace.get("entries", [])]
    ok = sum("allreduce" in n for n in names) >= 4
    return ok, f"Flight Recorder dump of {len(names)} collectives, {sum('allreduce' in n for n in names)} all-reduces"


def check_deepspeed(use_gpu):
    try:
        import deepspeed  # noqa: F401
    except ImportError as exc:
        return None, f"skipped: deepspeed is not importable ({exc})"
    from gpu_check_deepspeed import check_deepspeed as check

    return check(use_gpu)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="no GPU: check the script itself")
    args = parser.parse_args()
    import torch

    use_gpu = not args.cpu
    if use_gpu and not torch.cuda.is_available():
        print("no CUDA GPU visible; use --cpu")
        return 2
    print(f"torch {torch.__version__}, " + (f"GPU {torch.cuda.get_device_name(0)}" if use_gpu else "CPU"))
    failed = 0
    with tempfile.TemporaryDirectory() as directory:
        handle, pixels, labels = digits_handle(directory)
        for name, check in (("training", lambda: check_training(handle, pixels, labels, use_gpu)),
                            ("inference", lambda: check_inference(pixels, use_gpu)),
                            ("fork after CUDA", lambda: check_fork_after_cuda(handle, use_gpu)),
                            ("FSDP2", lambda: check_fsdp(directory, use_gpu)),
                            ("DeepSpeed", lambda: check_deepspeed(use_gpu)),
                            ("stall with NCCL's Flight Recorder", lambda: check_stall(use_gpu))):
            try:
                ok, detail = check()
            except Exception as exc:  # noqa: BLE001 -- report and go on to the next check
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            failed += ok is False
            print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
