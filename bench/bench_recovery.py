"""Failure detection and recovery times on the 2-worker standalone cluster (``make bench-recovery``).

- detection: from the moment a rank fails (it records the time) to TrainingFailedError on the driver, for a
  raised exception and for a SIGKILL, while the peer blocks in an all-reduce;
- recovery: a run whose rank 1 is SIGKILLed once, with max_retries=1, against the same run without failure;
- timeout: how far past ``timeout`` the RunTimeoutError (with every rank's stack) arrives.
"""
import argparse
import os
import signal
import tempfile
import time

from _cluster import median, save, standalone_session


def fail_at_half_second(how, stamp_dir):
    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    dist.init_process_group("gloo")
    ctx = get_context()
    if ctx.rank == 1 and ctx.attempt == 0 and how != "none":
        time.sleep(0.5)
        with open(os.path.join(stamp_dir, "failed_at"), "w") as f:
            f.write(repr(time.time()))
        if how == "raise":
            raise RuntimeError("injected failure")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "hang":
            time.sleep(600)
    dist.all_reduce(torch.ones(1))
    return ctx.attempt


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    from spark_dist import Distributor, TrainingFailedError

    figures = {}
    with standalone_session("bench_recovery") as spark, tempfile.TemporaryDirectory() as stamps:
        Distributor(num_processes=2, verbose=False).run(fail_at_half_second, "none", stamps)  # warm
        for how in ("raise", "kill"):
            seconds = []
            for _ in range(args.repeats):
                try:
                    Distributor(num_processes=2, verbose=False).run(fail_at_half_second, how, stamps)
                except TrainingFailedError:
                    seconds.append(time.time() - float(open(os.path.join(stamps, "failed_at")).read()))
            figures[f"detection after {how}"] = median(seconds)
        clean, retried = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            Distributor(num_processes=2, verbose=False).run(fail_at_half_second, "none", stamps)
            clean.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert Distributor(num_processes=2, max_retries=1, verbose=False).run(
                fail_at_half_second, "kill", stamps) == 1
            retried.append(time.perf_counter() - t0)
        figures["clean run"] = median(clean)
        figures["run with one SIGKILL and a retry"] = median(retried)
        t0 = time.perf_counter()
        try:
            Distributor(num_processes=2, timeout=5, verbose=False).run(fail_at_half_second, "hang", stamps)
        except TrainingFailedError:
            figures["timeout=5s reported after"] = time.perf_counter() - t0
    print("| measure | seconds |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.2f} |")
    save(args.out, figures)


if __name__ == "__main__":
    main()
