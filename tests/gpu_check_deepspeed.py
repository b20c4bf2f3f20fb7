"""DeepSpeed check for a GPU machine (not part of the suite: pytest does not collect it), for tests/gpu_check.py.

    python tests/gpu_check_deepspeed.py [--cpu]

``check_deepspeed(use_gpu)`` runs tests/scripts/train_deepspeed.py through ``spark_dist.DeepspeedTorchDistributor``
in local mode (no JVM, no Spark job): ZeRO stages 2 and 3 as a function whose first attempt fails after a
checkpoint, the retry resuming from DeepSpeed's checkpoint; then ZeRO 3 as a script given a config file, which
trains, saves, and resumes in a fresh engine. On GPUs: one rank per GPU, up to 2 (NCCL); ``--cpu``: 2 ranks
over gloo. It needs torch, deepspeed, cloudpickle and pyspark's Python package.
"""
import argparse
import json
import math
import os
import sys
import tempfile

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "scripts", "train_deepspeed.py")
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.insert(0, os.path.dirname(SCRIPT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def zero_config(stage):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
            "zero_optimization": {"stage": stage}}


def _same(a, b, use_gpu):
    """Equal losses: to the bit on CPU; on a GPU within float32 rounding (cuBLAS may pick other kernels)."""
    return all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-7) if use_gpu else x == y for x, y in zip(a, b))


def check_deepspeed(use_gpu):
    """ZeRO 2 and 3 with a resume, through the drop-in in local mode. Returns ``(ok, detail)``."""
    try:
        import deepspeed  # noqa: F401
        import torch
    except ImportError as exc:
        return False, f"cannot import: {exc}"
    from spark_dist import DeepspeedTorchDistributor
    from train_deepspeed import train

    ranks = min(2, torch.cuda.device_count()) if use_gpu else 2
    if ranks < 1:
        return False, "no CUDA device"
    notes, ok = [], True
    for stage in (2, 3):
        record = tempfile.mkdtemp(prefix="ds-check-")
        try:
            d = DeepspeedTorchDistributor(numGpus=ranks, localMode=True, useGpu=use_gpu,
                                          deepspeedConfig=zero_config(stage), max_retries=1, verbose=False)
            out = d.run(train, record_dir=record, steps=8, save_at=4, fail_at=6)
            with open(os.path.join(record, "attempt0.json")) as f:
                first = {int(k): v for k, v in json.load(f).items()}
        except Exception as exc:
            ok = False
            notes.append(f"ZeRO {stage}: {type(exc).__name__}: {str(exc)[:800]}")
            continue
        good = (out["stage"], out["attempt"], out["start"]) == (stage, 1, 4) and _same(
            [out["losses"][s] for s in (4, 5)], [first[4], first[5]], use_gpu)
        ok &= good
        notes.append(f"ZeRO {stage} on {ranks} rank(s): retry resumed at step {out['start']}, losses "
                     f"{first[4]:.6g} {first[5]:.6g} -> {out['losses'][4]:.6g} {out['losses'][5]:.6g}"
                     f"{'' if good else ' MISMATCH'}")
    record = tempfile.mkdtemp(prefix="ds-check-")
    try:
        config = os.path.join(record, "ds_config.json")
        with open(config, "w") as f:
            json.dump(zero_config(3), f)
        DeepspeedTorchDistributor(numGpus=ranks, localMode=True, useGpu=use_gpu, deepspeedConfig=config,
                                  verbose=False).run(SCRIPT, "--checkpoint_dir", os.path.join(record, "ckpt"),
                                                     "--record_dir", record)
        with open(os.path.join(record, "result.json")) as f:
            result = json.load(f)
        first, resumed = result["first"]["losses"], result["resumed"]["losses"]
        good = result["argv"][-3:] == ["--deepspeed", "--deepspeed_config", config] and sorted(resumed) == [
            "4", "5"] and _same([resumed["4"], resumed["5"]], [first["4"], first["5"]], use_gpu)
        ok &= good
        notes.append(f"ZeRO 3 script: resumed losses {'match' if good else 'MISMATCH'}")
    except Exception as exc:
        ok = False
        notes.append(f"ZeRO 3 script: {type(exc).__name__}: {str(exc)[:800]}")
    return ok, "; ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="check on CPU ranks (gloo) instead of GPUs")
    ok, detail = check_deepspeed(use_gpu=not parser.parse_args().cpu)
    print(f"{'ok  ' if ok else 'FAIL'} deepspeed: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
