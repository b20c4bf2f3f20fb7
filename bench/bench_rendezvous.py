"""The rendezvous at scale, without Spark and without training: the real Coordinator and the real task side of
the store protocol (spark_dist.task.barrier_task's arrival and assignment wait), driven by n simulated tasks.

Each simulated task is a thread with its own store client, as each Spark task has its own connection: it
publishes its TaskInfo, bumps ``arrived`` and waits on its own ``assignment/<i>`` key. The coordinator runs
its watch loop as on the driver until every task holds its assignment. Reported per n: the rendezvous time
(from the release of the connected tasks to the last assignment received) and the store requests each side
made (counted on the clients), and requests per second.

    python bench/bench_rendezvous.py --sizes 64 256 1024 --out bench/results/rendezvous-spark4.json

Goal (issue #38): <= 2 s for 1024 tasks, growing linearly with n.
"""
import argparse
import json
import os
import platform
import sys
import threading
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from anywhere; imported by the tests, the path is there already
    sys.path.append(_ROOT)

from spark_dist.backends.base import Backend  # noqa: E402
from spark_dist.config import RunConfig  # noqa: E402
from spark_dist.driver.coordinator import Coordinator  # noqa: E402
from spark_dist.wire.protocol import ARRIVED, LaunchSpec, task_key  # noqa: E402
from spark_dist.wire.ranks import TaskInfo
from spark_dist.wire.sealed_store import SealedStore, host_store, join_store  # noqa: E402
from spark_dist.task.barrier_task import _assignments  # noqa: E402

HOSTS = 8  # the simulated tasks spread over this many host names, as on a cluster


class Counting:
    """A store client that counts the requests made through it (what each side costs the store)."""

    def __init__(self, raw):
        self._raw = raw
        self.requests = 0

    def __getattr__(self, name):
        method = getattr(self._raw, name)

        def counted(*args, **kwargs):
            self.requests += 1
            return method(*args, **kwargs)
        return counted


class _NoBackend(Backend):
    name = "ddp"


def simulate(n: int, timeout: float = 120.0) -> dict:
    """One rendezvous of ``n`` simulated tasks; returns its time, request counts and every task's rank.

    Raises:
        RuntimeError: a task did not get its assignment.
    """
    secret, prefix = os.urandom(32), f"spark_dist/bench-{n}/0"
    server, port = host_store("127.0.0.1", timeout)
    config = RunConfig.build(num_processes=n, run_id=f"bench-{n}", spark_conf={})
    spec = LaunchSpec(run_id=config.run_id, attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=secret, rendezvous_timeout=timeout)
    driver = Counting(server)
    coordinator = Coordinator(SealedStore(driver, secret, prefix), config, spec, _NoBackend(),
                              job_ended=None, cancel=lambda: None, on_report=lambda r: None,
                              deadline=None, host="127.0.0.1")
    clients = [Counting(join_store("127.0.0.1", port, timeout)) for _ in range(n)]  # connected beforehand
    go, got = threading.Event(), [None] * n
    done = threading.Event()
    remaining = [n]
    lock = threading.Lock()

    def task(i):
        store = SealedStore(clients[i], secret, prefix)
        slot = TaskInfo(i, f"host{i % HOSTS}", (), f"host{i % HOSTS}:7077", i)
        go.wait()
        store.put(task_key(i), slot)
        store.counter(ARRIVED)
        got[i] = _assignments(store, spec, [slot])
        with lock:
            remaining[0] -= 1
            if not remaining[0]:
                done.set()

    threads = [threading.Thread(target=task, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    watcher = threading.Thread(target=coordinator.watch, args=(lambda s: done.wait(s),), daemon=True)
    started = time.perf_counter()
    watcher.start()
    go.set()
    if not done.wait(timeout):
        raise RuntimeError(f"{remaining[0]} of {n} simulated tasks got no assignment in {timeout:g}s")
    seconds = time.perf_counter() - started
    watcher.join(timeout)
    for t in threads:
        t.join(timeout)
    if any(a is None for a in got):
        raise RuntimeError("a simulated task's rendezvous was aborted")
    task_requests = sum(c.requests for c in clients)
    del clients, coordinator, server
    return {"tasks": n, "seconds": seconds, "driver_requests": driver.requests, "task_requests": task_requests,
            "requests_per_second": (driver.requests + task_requests) / seconds,
            "ranks": sorted(a[0].rank.rank for a in got)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    for n in args.sizes:
        runs = [simulate(n) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["seconds"])
        median = sorted(r["seconds"] for r in runs)[len(runs) // 2]
        rows.append({k: v for k, v in best.items() if k != "ranks"} | {"median_seconds": median})
        print(f"{n:5d} tasks: rendezvous {median:.3f} s (median of {args.repeat}), "
              f"{best['driver_requests']} driver + {best['task_requests']} task requests, "
              f"{best['requests_per_second']:.0f} requests/s", flush=True)
    per_task = [r["median_seconds"] / r["tasks"] for r in rows]
    print(f"time per task: {', '.join(f'{1000 * t:.2f} ms' for t in per_task)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
                       "sizes": rows}, f, indent=1)


if __name__ == "__main__":
    main()
