"""What timing every step costs a steady training loop: the same loop with and without a rank's step clock.

    python bench/bench_step_clock.py [--blocks 60] [--block-steps 10] [--out bench/results/step_clock-spark4.json]

Each rank's loader hands its batches through ``counted`` (spark_dist/data/read/loader_state.py), which, with a
:class:`spark_dist.task.steps.StepClock`, counts each step into the clock file the supervisor maps and times its
wait for data and its compute (two reads of ``/proc/thread-self/schedstat`` a step): what the stall watch, the
straggler summary and the goodput split read. One process, one thread, no Spark: bench_steady.py's MLP
(512-1024-1024-10, SGD, a batch of 128) trained on in-memory batches handed through ``counted`` with the clock
and without it, in short blocks taking turns; the figure is the ratio of the median step times. Goal (issue
#57): the clock costs at most 1% of steps/s (ratio >= 0.99, measured in the one run).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from spark_dist.data.read.loader_state import counted  # noqa: E402
from spark_dist.task.steps import StepClock, make_clock_file  # noqa: E402


def model_and_batches(steps: int):
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [{"x": torch.randn(128, 512), "y": torch.randint(0, 10, (128,))} for _ in range(8)]
    return model, optimizer, [batches[i % len(batches)] for i in range(steps)]


def one_block(model, optimizer, batches, clock, times) -> None:
    """Train on ``batches`` handed through ``counted`` (``clock`` None: no step clock, as before it existed);
    each step's seconds, from the batch handed over to the next, into ``times``."""
    import torch

    loader = SimpleNamespace(batches=0, rows=0, _at=None, on_progress=None, step_clock=clock)
    before = time.perf_counter()
    for batch in counted(loader, 0, iter(batches), 0, len(batches)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"]).backward()
        optimizer.step()
        now = time.perf_counter()
        times.append(now - before)
        before = now


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=60, help="blocks of each kind, taking turns")
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    model, optimizer, batches = model_and_batches(args.block_steps)
    one_block(model, optimizer, batches * 3, None, [])  # warm-up
    times = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        clock = StepClock(make_clock_file(tmp))
        for _ in range(args.blocks):  # short blocks taking turns: the machine's drift hits both alike
            one_block(model, optimizer, batches, None, times["without"])
            one_block(model, optimizer, batches, clock, times["with"])
        clock.close()
    medians = {k: statistics.median(v) for k, v in times.items()}
    rates = {k: round(1 / v, 2) for k, v in medians.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "config": vars(args),
              "median_step_ms": {k: round(v * 1000, 3) for k, v in medians.items()},
              "median_steps_per_s": rates, "ratio": round(medians["without"] / medians["with"], 4),
              "steps_each": len(times["with"])}
    print(f"steps/s without the clock {rates['without']:.1f}, with it {rates['with']:.1f}: "
          f"ratio {result['ratio']:.4f} (goal >= 0.99)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
