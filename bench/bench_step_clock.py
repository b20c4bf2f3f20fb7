"""What timing every step costs a steady training loop: the same loop with and without a rank's step clock.

    python bench/bench_step_clock.py [--steps 300] [--repeat 7] [--out bench/results/step_clock-spark4.json]

Each rank's loader hands its batches through ``counted`` (spark_dist/data/read/loader_state.py), which, with a
:class:`spark_dist.task.steps.StepClock`, counts each step into the clock file the supervisor maps and times its
wait for data and its compute (two reads of ``/proc/thread-self/schedstat`` a step): what the stall watch, the
straggler summary and the goodput split read. One process, one thread, no Spark: bench_steady.py's MLP
(512-1024-1024-10, SGD, a batch of 128) trained on in-memory batches handed through ``counted`` with the clock
and without it, the two taking turns for ``--repeat`` rounds. Goal (issue #57): the clock costs at most 1% of
steps/s (ratio of the medians >= 0.99, measured in the one run).
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


def one_round(model, optimizer, batches, clock) -> float:
    """Steps per second of one epoch over ``batches`` (``clock`` None: no step clock, as before it existed)."""
    import torch

    loader = SimpleNamespace(batches=0, rows=0, _at=None, on_progress=None, step_clock=clock)
    started = time.perf_counter()
    for batch in counted(loader, 0, iter(batches), 0, len(batches)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"]).backward()
        optimizer.step()
    return len(batches) / (time.perf_counter() - started)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    model, optimizer, batches = model_and_batches(args.steps)
    one_round(model, optimizer, batches[:30], None)  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        clock = StepClock(make_clock_file(tmp))
        rates = {"without": [], "with": []}
        for _ in range(args.repeat):
            rates["without"].append(one_round(model, optimizer, batches, None))
            rates["with"].append(one_round(model, optimizer, batches, clock))
        summary = clock.summary()
        clock.close()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "config": vars(args),
              "steps_per_s": rates, "median_steps_per_s": medians,
              "ratio": round(medians["with"] / medians["without"], 4),
              "round_ratios": [round(w / wo, 4) for w, wo in zip(rates["with"], rates["without"])],
              "clock_step_p50_ms": round(summary["step_p50"] * 1000, 3)}
    print(f"steps/s without the clock {medians['without']:.1f}, with it {medians['with']:.1f}: "
          f"ratio {result['ratio']:.4f} (goal >= 0.99)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
