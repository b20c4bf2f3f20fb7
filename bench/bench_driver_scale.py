"""The driver at scale (issue #57, item 4): what watching n ranks costs the driver, without Spark and without torch
training: the real store and the real :class:`~spark_dist.driver.coordinator.Coordinator` in a process of their own
(the driver), and n stand-in ranks with their supervisors in another (this one), each rank with its own three store
clients, as on a cluster (its supervisor's, its supervisor's abort watch's, and its rank process's ``_Reporter``).

After the rendezvous (the real task side: ``spark_dist.task.barrier_task._assignments``), every simulated rank, for
``--seconds``:

- sends one ``ctx.report`` record a second through the real ``reports`` StoreLog (what ``_Reporter`` does), the
  record's ``time`` the sending moment;
- has its supervisor write its sealed heartbeat ``(beat, steps)`` every second and look for a stall's request for
  stacks (what ``_supervise`` does with each beat), its step count rising;
- has its supervisor publish its buffered output every SUPERVISOR_POLL_S, as ``_supervise``'s loop does in its
  steady state (the real ``Publisher`` over the real ``LineBuffer``), and read its abort watch there (the real
  ``AbortWatch``: a thread blocked in the store's wait on ``abort``; the supervisor looks at the key itself, every
  ABORT_POLL_S, only where the watch cannot wait);
- prints about 1 KiB a second (LINES_PER_PRINT lines of LINE_BYTES, once a second) into that buffer;
- and rank 0 also puts its loader's progress 4 times a second.

The driver process hosts the store and runs ``Coordinator.watch`` with callbacks that do what the Distributor does,
cheaply: a report is kept in a history list, a printed line is counted. Measured per n, from this process with
psutil (so the measuring costs the driver nothing): the driver's CPU (user + system over the window, as a fraction
of one core, split into its watch loop's thread and the rest, mostly the store's server thread), its RSS growth
(after WARMUP_S of the window vs at its end), and each report's latency (the record's ``time`` vs the moment the
driver's ``on_report`` saw it: both processes are on one machine, so ``time.time()`` compares): p50 and p99. Counted
too: the store requests each side made a second (the ranks' through counting clients, the coordinator's own), the
supervisors' own looks at ``abort`` a second (none while their watches wait) and the watches still waiting at the
window's end.

    python bench/bench_driver_scale.py --out bench/results/driver_scale-spark4.json
    python bench/bench_driver_scale.py --sizes 256 --seconds 15 --profile /tmp/driver.prof   # where the time goes

Goals at 1,024 ranks: the driver below 25% of one core, its RSS growth below 256 MiB, a report's latency p99 below
2 s; and each of these figures grows at most linearly with the number of ranks.

Both processes share this machine: on a machine of few cores the simulated ranks compete with the driver for them,
which lengthens latencies (not the driver's CPU time), and one process of Python threads may not offer the whole
load (1,024 real supervisors run on as many cores as their executors have). The results record the load average,
how late the stand-in supervisors were on their schedule (``beat_lag_p99_s``) and the requests they made: where the
schedule fell behind, less load was offered than asked for, and the driver's figures are for what was offered.
"""
import argparse
import array
import heapq
import json
import multiprocessing
import os
import platform
import random
import resource
import sys
import threading
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from anywhere; imported by the tests, the path is there already
    sys.path.append(_ROOT)

from spark_dist.backends.base import Backend  # noqa: E402
from spark_dist.config import RunConfig  # noqa: E402
from spark_dist.driver.coordinator import Coordinator  # noqa: E402
from spark_dist.task import output  # noqa: E402
from spark_dist.task.barrier_task import ABORT_POLL_S, HEARTBEAT_S, STACKS_LOOK_EVERY, _assignments  # noqa: E402
from spark_dist.task.rank_process import REPORT_CONFIRM_EVERY  # noqa: E402
from spark_dist.wire.abort_watch import AbortWatch, release  # noqa: E402
from spark_dist.wire.protocol import (ABORT, ARRIVED, PROGRESS, REPORTS, STACKS_WANTED, LaunchSpec,  # noqa: E402
                                      beat_key, task_key)
from spark_dist.wire.ranks import TaskInfo  # noqa: E402
from spark_dist.wire.sealed_store import SealedStore, host_store, join_store  # noqa: E402
from spark_dist.wire.store_log import StoreLog  # noqa: E402
from bench_rendezvous import Counting  # noqa: E402 -- a store client that counts its requests

HOSTS = 8  # the simulated ranks spread over this many host names, as on a cluster
STORE_TIMEOUT_S = 120.0  # the store's and the rendezvous' timeout
SUPERVISOR_POLL_S = 0.05  # _supervise's loop in its steady state: waiter.join(poll), poll doubling up to 0.05 s
REPORT_EVERY_S = 1.0  # each rank's ctx.report
PROGRESS_EVERY_S = 0.25  # rank 0's loader progress (spark_dist.task.context.PROGRESS_EVERY_S)
PRINT_EVERY_S = 1.0  # each rank prints LINES_PER_PRINT lines at once this often: LINES_PER_PRINT * LINE_BYTES a second
LINES_PER_PRINT = 8
LINE_BYTES = 128
STEPS_PER_S = 10  # each rank's step count rises this fast (no stall is ever diagnosed)
WARMUP_S = 5.0  # the driver's RSS is read this long into the window (a third of a shorter window), then at its end
# The threads serving the simulated ranks here, each serving every THREADS-th rank. Few: the store clients' round
# trips release the GIL, but every other step of a supervisor's turn holds it, and more threads only fight over it
# (at 1,024 ranks on 2 cores, 4 threads made 19.8k requests a second, 8 made 17.7k, 32 made 12.6k).
THREADS = 4
FD_HEADROOM = 256  # file descriptors this process needs besides the ranks' store clients
CLIENTS_PER_RANK = 3  # the supervisor's, its abort watch's, the rank process's
# The linear-growth check: a figure at n2 ranks may be at most (n2 / n1) * LINEAR_SLACK times its value at n1, each
# figure counted as at least its floor, so that noise around a small value (a latency of a millisecond, an RSS that
# did not grow) does not read as growth.
LINEAR_SLACK = 1.25
FLOORS = {"driver_cpu_fraction": 0.01, "rss_growth_mib": 4.0, "report_latency_p50_s": 0.005,
          "report_latency_p99_s": 0.02}
GOALS = {"driver_cpu_fraction": 0.25, "rss_growth_mib": 256.0, "report_latency_p99_s": 2.0}  # at GOAL_RANKS, below
GOAL_RANKS = 1024


class _NoBackend(Backend):
    name = "ddp"


def launch_spec(run_id: str, port: int, secret: bytes) -> LaunchSpec:
    """What the tasks are given (both processes build the same one once the store's port is known)."""
    return LaunchSpec(run_id=run_id, attempt=0, store_host="127.0.0.1", store_port=port, job_bytes=b"",
                      secret=secret, rendezvous_timeout=STORE_TIMEOUT_S)


def percentile(values, q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0.0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# --------------------------------------------------------------------------------------------------------
# The driver's process
# --------------------------------------------------------------------------------------------------------
class DriverSide:
    """The Distributor's callbacks, cheaply: ``history`` holds every report record (as ``Distributor.history``
    does), ``latencies`` each report's delay in seconds (instrumentation: 8 bytes a report), and the printed
    lines are counted, not kept."""

    def __init__(self):
        self.history = []
        self.latencies = array.array("d")
        self.output_lines = 0
        self.output_bytes = 0
        self.progress_updates = 0

    def on_report(self, record: dict) -> None:
        self.latencies.append(time.time() - record["time"])
        self.history.append(record)

    def on_output(self, rank: int, stream: str, line: str) -> None:
        self.output_lines += 1
        self.output_bytes += len(line)

    def on_progress(self, progress: tuple) -> None:
        self.progress_updates += 1


def driver_main(conn, n: int, run_id: str, secret: bytes, profile_path=None) -> None:
    """The driver's process: host the store, run the coordinator's watch until the parent says ``stop``, drain
    what is left, and send back what it saw. Talks over ``conn``: sends ``("port", port)``, receives ``"mark"``
    (count the coordinator's requests from here / to here) and then ``"stop"``, sends ``("seen", dict)``."""
    server, port = host_store("127.0.0.1", STORE_TIMEOUT_S)
    spec = launch_spec(run_id, port, secret)
    config = RunConfig.build(num_processes=n, run_id=run_id, spark_conf={})
    side = DriverSide()
    counted = Counting(server)  # the coordinator's own requests (the watch loop's thread alone uses it)
    store = SealedStore(counted, secret, spec.prefix)
    stop = threading.Event()
    coordinator = Coordinator(store, config, spec, _NoBackend(), job_ended=stop.is_set, cancel=lambda: None,
                              on_report=side.on_report, deadline=None, host="127.0.0.1", on_output=side.on_output,
                              on_progress=side.on_progress)
    marks = []  # the coordinator's request count at each "mark": the window's start and end

    def listen():
        while conn.recv() == "mark":
            marks.append(counted.requests)
        stop.set()
    threading.Thread(target=listen, daemon=True).start()
    conn.send(("port", port))
    profiler = None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # the watch loop's CPU time: waits and preemptions cost none
        profiler.enable()
    coordinator.watch(stop.wait)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_path)
    coordinator.drain_reports(final=True)
    coordinator.drain_output(final=True)
    coordinator.drain_progress(time.monotonic(), final=True)
    conn.send(("seen", {
        "reports_received": len(side.history), "report_latency_p50_s": percentile(side.latencies, 0.5),
        "report_latency_p99_s": percentile(side.latencies, 0.99),
        "report_latency_max_s": max(side.latencies, default=0.0),
        "output_lines_received": side.output_lines, "output_bytes_received": side.output_bytes,
        "progress_updates": side.progress_updates, "reports_dropped": coordinator.reports.dropped,
        "abort": None if (abort := store.lookup(ABORT)) is None else str(abort),
        "lost_ranks": [r.rank for r in coordinator.lost_ranks], "stalls": coordinator.stall_watch.stalls,
        "ranks_assigned": len(coordinator.ranks), "driver_requests": marks[-1] - marks[0] if marks else 0}))
    release(store)  # as the Attempt does before it drops the store: the watches still waiting end
    conn.close()


# --------------------------------------------------------------------------------------------------------
# The simulated ranks (this process)
# --------------------------------------------------------------------------------------------------------
class SimRank:
    """One rank and its supervisor, as the driver sees them: the supervisor's store client (``sup``: rendezvous,
    beats, output), its abort watch's (``watch``, started once the rank is assigned, as ``_supervise`` starts it)
    and the rank process's own (``own``: reports and progress), with the real output path."""

    def __init__(self, index: int, spec: LaunchSpec):
        self.index = index
        self.slot = TaskInfo(index, f"host{index % HOSTS}", (), f"host{index % HOSTS}:7077", index)
        self.clients = [Counting(join_store("127.0.0.1", spec.store_port, STORE_TIMEOUT_S))
                        for _ in range(CLIENTS_PER_RANK)]
        self.sup, self.own, self._watch_store = (SealedStore(client, spec.secret, spec.prefix)
                                                 for client in self.clients)
        self.watch = None
        self.next_abort = 0.0
        self.reports = StoreLog(self.own, REPORTS, writer=f"rank{index}")
        self.lines = output.LineBuffer()
        self.publisher = output.Publisher(self.sup, index, self.lines)
        self.beats = 0
        self.rank = None  # its rank number, once assigned
        # Counted here: what this rank sent (reports, printed bytes, supervisor polls) and the abort it saw.
        self.reports_sent = self.bytes_printed = self.polls = 0
        self.abort_seen = None

    def requests(self) -> int:
        """The store requests this rank and its supervisor made so far."""
        return sum(client.requests for client in self.clients)

    def arrive(self) -> None:
        """The task's side of the rendezvous, first half: publish where it runs, bump ``arrived``."""
        self.sup.put(task_key(self.index), self.slot)
        self.sup.counter(ARRIVED)

    def assigned(self, spec: LaunchSpec) -> bool:
        """The second half: wait for its assignment (the real wait); False when the driver aborted it."""
        got = _assignments(self.sup, spec, [self.slot])
        self.rank = None if got is None else got[0].rank.rank
        if got is not None:
            self.watch = AbortWatch(lambda: self._watch_store, ABORT_POLL_S)
        return got is not None

    def poll(self) -> None:
        """One turn of _supervise's loop: publish what is due, read the abort watch (and look at ``abort`` every
        ABORT_POLL_S only where it cannot wait)."""
        self.publisher.publish()
        abort = self.watch.value
        if abort is None and not self.watch.live and time.monotonic() >= self.next_abort:
            self.next_abort = time.monotonic() + ABORT_POLL_S
            abort = self.sup.lookup(ABORT)
            self.polls += 1
        if abort is not None and self.abort_seen is None:
            self.abort_seen = str(abort)

    def beat(self, steps: int) -> None:
        """The supervisor's beat: the sealed ``(beat, steps)``, then (every STACKS_LOOK_EVERY beats) its look for a
        stall's request for stacks."""
        self.beats += 1
        self.sup.put(beat_key(self.rank), (self.beats, steps))
        if self.beats % STACKS_LOOK_EVERY == 1:
            self.sup.lookup(STACKS_WANTED, 0)

    def report(self, steps: int) -> None:
        """A ``ctx.report(loss=..., step=...)``, as ``TrainContext.report`` builds it and ``_Reporter`` sends it (a
        round trip every REPORT_CONFIRM_EVERY records)."""
        self.reports_sent += 1
        self.reports.append({"rank": self.rank, "attempt": 0, "time": time.time(), "loss": 1.0 / (1 + steps),
                             "step": steps}, confirm=self.reports_sent % REPORT_CONFIRM_EVERY == 0)

    def print_lines(self, steps: int) -> None:
        """LINES_PER_PRINT lines of LINE_BYTES, read from the rank's stdout (the StreamReader's part)."""
        for k in range(LINES_PER_PRINT):
            head = f"rank {self.rank} step {steps} line {k} "
            line = head + "x" * (LINE_BYTES - len(head))
            self.lines.add("stdout", line)
            self.bytes_printed += len(line)

    def progress(self, steps: int) -> None:
        """Rank 0's loader progress, ``(epoch, step, steps, steps_per_second, finished)``."""
        self.own.put(PROGRESS, (steps // 1000, steps % 1000 + 1, 1000, float(STEPS_PER_S), None))


class Schedule:
    """The timed actions of the ranks one thread serves: a heap of ``(due, seq, period, action, sim)``, each
    action run at its due time, then due again a period later (a late one is not repeated to catch up: a missed
    period is skipped). Keeps how late each beat ran (``beat_lags``)."""

    def __init__(self, sims, started: float, rng: random.Random):
        self.started = started
        self.heap = []
        self.seq = 0
        self.beat_lags = array.array("d")
        for sim in sims:
            self._add(SimRank.poll, SUPERVISOR_POLL_S, sim, rng)
            self._add(SimRank.beat, HEARTBEAT_S, sim, rng)
            self._add(SimRank.report, REPORT_EVERY_S, sim, rng)
            self._add(SimRank.print_lines, PRINT_EVERY_S, sim, rng)
            if sim.rank == 0:
                self._add(SimRank.progress, PROGRESS_EVERY_S, sim, rng)

    def _add(self, action, period: float, sim: SimRank, rng: random.Random) -> None:
        self._push(self.started + rng.uniform(0, period), period, action, sim)

    def _push(self, due: float, period: float, action, sim: SimRank) -> None:
        self.seq += 1  # ties go in the order pushed; never compares two SimRanks
        heapq.heappush(self.heap, (due, self.seq, period, action, sim))

    def run(self, stop: threading.Event) -> None:
        """Run the actions until ``stop``."""
        while not stop.is_set():
            due, _, period, action, sim = self.heap[0]
            now = time.monotonic()
            if due > now:
                stop.wait(due - now)
                continue
            heapq.heappop(self.heap)
            if action is SimRank.poll:
                sim.poll()
            else:
                steps = int((now - self.started) * STEPS_PER_S)
                if action is SimRank.beat:
                    self.beat_lags.append(now - due)
                action(sim, steps)
            following = due + period
            self._push(following if following > now - period else now, period, action, sim)


def serve(sims, spec: LaunchSpec, ready: threading.Barrier, go: threading.Event, stop: threading.Event,
          schedules: list, errors: list) -> None:
    """One thread's part: connect its ranks and rendezvous (all arrive, then each waits for its assignment), wait
    for ``go``, then run its schedule until ``stop``. A failure is put in ``errors`` (and breaks ``ready``)."""
    try:
        for sim in sims:
            sim.arrive()
        if not all(sim.assigned(spec) for sim in sims):
            raise RuntimeError("the driver aborted the rendezvous")
        ready.wait()
    except threading.BrokenBarrierError:  # another thread failed, or the main thread gave up waiting
        return
    except BaseException as exc:  # noqa: BLE001 -- reported by the main thread
        errors.append(exc)
        ready.abort()
        return
    go.wait()
    schedule = Schedule(sims, time.monotonic(), random.Random(sims[0].index if sims else 0))
    schedules.append(schedule)
    schedule.run(stop)


def enough_descriptors(n: int) -> None:
    """Raise the soft limit on open files to what the ranks' store clients need (up to the hard limit).

    Raises:
        RuntimeError: the hard limit is too low.
    """
    needed = CLIENTS_PER_RANK * n + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise RuntimeError(f"{n} ranks need {needed} file descriptors; the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _cpu(process) -> dict:
    """The driver's CPU seconds so far: in all, and per thread (``tid -> seconds``)."""
    times = process.cpu_times()
    return {"total": times.user + times.system,
            "threads": {t.id: t.user_time + t.system_time for t in process.threads()}}


def _cpu_split(before: dict, after: dict, watch_tid: int, seconds: float) -> dict:
    """The CPU fractions of one core, over ``seconds``: the watch loop's thread, and all the others (mostly the
    store's server thread)."""
    used = {tid: spent - before["threads"].get(tid, 0.0) for tid, spent in after["threads"].items()}
    watch = used.pop(watch_tid, 0.0)
    return {"driver_watch_thread_fraction": watch / seconds,
            "driver_other_threads_fraction": sum(used.values()) / seconds}


def simulate(n: int, seconds: float, threads: int = THREADS, profile_path=None) -> dict:
    """One run of ``n`` simulated ranks for ``seconds`` against a driver in its own process; returns its figures.

    Raises:
        RuntimeError: the rendezvous failed, or the driver ended early.
    """
    import psutil
    import torch.distributed  # noqa: F401 -- imported before the clock starts: the first client would import it

    enough_descriptors(n)
    run_id, secret = f"scale-{n}", os.urandom(32)
    parent_conn, child_conn = multiprocessing.Pipe()
    driver = multiprocessing.get_context("spawn").Process(
        target=driver_main, args=(child_conn, n, run_id, secret, profile_path), daemon=True)
    driver.start()
    try:
        row = _measure(n, seconds, threads, run_id, secret, parent_conn, psutil.Process(driver.pid))
    except BaseException:
        driver.kill()  # it may be waiting for a "stop" that will not come
        raise
    finally:
        driver.join(30)
        if driver.is_alive():
            driver.kill()
            driver.join()
        parent_conn.close()
    return row


def _measure(n, seconds, threads, run_id, secret, conn, process) -> dict:
    """The run itself, once the driver's process started (see :func:`simulate`); the threads serving the ranks
    have ended when it returns or raises."""
    if not conn.poll(STORE_TIMEOUT_S):
        raise RuntimeError("the driver's process did not start its store")
    _, port = conn.recv()
    spec = launch_spec(run_id, port, secret)
    load_before = os.getloadavg()
    started = time.perf_counter()
    sims = [SimRank(i, spec) for i in range(n)]  # connected beforehand, as bench_rendezvous does
    connected = time.perf_counter()
    threads = min(threads, n)
    ready, go, stop = threading.Barrier(threads + 1), threading.Event(), threading.Event()
    schedules, errors = [], []
    workers = [threading.Thread(target=serve, args=(sims[k::threads], spec, ready, go, stop, schedules, errors),
                                daemon=True) for k in range(threads)]
    for worker in workers:
        worker.start()
    try:
        return _window(n, seconds, sims, workers, schedules, errors, conn, process, ready, go, stop) | {
            "connect_seconds": connected - started, "load_before": load_before, "load_after": os.getloadavg()}
    finally:
        stop.set()
        go.set()
        ready.abort()
        for worker in workers:
            worker.join(60)


def _window(n, seconds, sims, workers, schedules, errors, conn, process, ready, go, stop) -> dict:
    """From the rendezvous to the driver's answer: the measured window and its figures."""
    waited = time.perf_counter()
    try:
        ready.wait(STORE_TIMEOUT_S + 30)
    except threading.BrokenBarrierError:
        raise RuntimeError(f"the rendezvous of {n} simulated ranks failed: {errors[:1]}") from None
    rendezvous = time.perf_counter() - waited
    # The window: from go to stop. The driver's CPU over all of it, its RSS after the warm-up vs at the end.
    conn.send("mark")
    window_start, cpu_before, requests_before = time.monotonic(), _cpu(process), sum(s.requests() for s in sims)
    go.set()
    time.sleep(min(WARMUP_S, seconds / 3))
    rss_warm = process.memory_info().rss
    time.sleep(max(window_start + seconds - time.monotonic(), 0.0))
    cpu_after, rss_end = _cpu(process), process.memory_info().rss
    window = time.monotonic() - window_start
    conn.send("mark")
    stop.set()
    requests = sum(s.requests() for s in sims) - requests_before
    watching = sum(1 for s in sims if s.watch is not None and s.watch.live and s.watch.value is None)
    for worker in workers:
        worker.join(60)
    for sim in sims:  # what each rank printed last, as its supervisor flushes it once the rank exited
        if sim.watch is not None:
            sim.watch.close()  # as _supervise closes it once its rank ended: left waiting for the driver's release
        sim.publisher.flush([], timeout=10.0)
    conn.send("stop")
    if not conn.poll(120):
        raise RuntimeError("the driver did not answer")
    _, seen = conn.recv()
    for sim in sims:  # the driver released them before it answered
        if sim.watch is not None:
            sim.watch.join(10)
    seen["driver_requests_per_s"] = seen.pop("driver_requests") / window
    lags = [lag for s in schedules for lag in s.beat_lags]
    return {"ranks": n, "seconds": window, "rendezvous_seconds": rendezvous,
            "driver_cpu_fraction": (cpu_after["total"] - cpu_before["total"]) / window,
            **_cpu_split(cpu_before, cpu_after, process.pid, window),
            "rss_warm_mib": rss_warm / 2 ** 20, "rss_end_mib": rss_end / 2 ** 20,
            "rss_growth_mib": (rss_end - rss_warm) / 2 ** 20,
            "reports_sent": sum(s.reports_sent for s in sims), "output_bytes_sent": sum(s.bytes_printed for s in sims),
            "supervisor_polls_per_rank_s": sum(s.polls for s in sims) / n / window, "abort_watches_waiting": watching,
            "rank_requests_per_s": requests / window, "rank_requests_per_rank_s": requests / window / n,
            "beat_lag_p99_s": percentile(lags, 0.99), "abort_seen_by_ranks": next(
                (s.abort_seen for s in sims if s.abort_seen), None), **seen}


# --------------------------------------------------------------------------------------------------------
# Checks and output
# --------------------------------------------------------------------------------------------------------
def linear_checks(rows: list) -> dict:
    """Per figure, whether it grows at most linearly with ranks: between each pair of consecutive sizes, the
    figure's ratio (each value counted as at least its floor) against the ranks' ratio times LINEAR_SLACK."""
    rows = sorted(rows, key=lambda r: r["ranks"])
    checks = {}
    for figure, floor in FLOORS.items():
        steps = []
        for small, large in zip(rows, rows[1:]):
            ratio = max(large[figure], floor) / max(small[figure], floor)
            allowed = large["ranks"] / small["ranks"] * LINEAR_SLACK
            steps.append({"from": small["ranks"], "to": large["ranks"], "ratio": ratio, "allowed": allowed,
                          "ok": ratio <= allowed})
        checks[figure] = {"at_most_linear": all(s["ok"] for s in steps), "steps": steps}
    return checks


def goal_checks(rows: list) -> dict:
    """The goals at GOAL_RANKS (each figure below its goal), where that size was measured."""
    at = [r for r in rows if r["ranks"] == GOAL_RANKS]
    if not at:
        return {}
    return {figure: {"ranks": GOAL_RANKS, "below": goal, "measured": at[0][figure], "met": at[0][figure] < goal}
            for figure, goal in GOALS.items()}


def print_profile(path: str, top: int = 25) -> None:
    """The driver's watch loop's top functions, by their own time and by cumulative time."""
    import pstats

    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=THREADS, help="threads serving the simulated ranks")
    parser.add_argument("--profile", help="cProfile the driver's watch loop into this file (each size overwrites)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    # Each store client looks up the name of the address it connected to (torch's c10d, for its log) while holding
    # the GIL; where the DNS server drops a query that costs glibc's default 5 s timeout, every connect of this
    # process waiting. Before the window, and not the driver's cost: a 1 s timeout here shortens the setup only.
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    rows = []
    for n in args.sizes:
        row = simulate(n, args.seconds, args.threads, args.profile)
        rows.append(row)
        print(f"{n:5d} ranks, {row['seconds']:.0f} s: driver CPU {row['driver_cpu_fraction']:.1%} of a core "
              f"(watch loop {row['driver_watch_thread_fraction']:.1%}, other threads "
              f"{row['driver_other_threads_fraction']:.1%}), RSS growth {row['rss_growth_mib']:.1f} MiB, report "
              f"latency p50 {1000 * row['report_latency_p50_s']:.1f} ms p99 {1000 * row['report_latency_p99_s']:.1f} "
              f"ms, reports {row['reports_received']}/{row['reports_sent']}, output {row['output_bytes_received']}/"
              f"{row['output_bytes_sent']} bytes, beat lag p99 {1000 * row['beat_lag_p99_s']:.0f} ms, "
              f"{row['rank_requests_per_rank_s']:.1f} requests a rank a second", flush=True)
    if args.profile:
        print_profile(args.profile)
    linear, goals = linear_checks(rows), goal_checks(rows)
    for figure, check in linear.items():
        print(f"{figure}: {'at most linear' if check['at_most_linear'] else 'GROWS FASTER THAN LINEAR'}")
    for figure, goal in goals.items():
        print(f"goal at {goal['ranks']} ranks: {figure} {goal['measured']:.3g} < {goal['below']:g}: "
              f"{'met' if goal['met'] else 'MISSED'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores", "platform": platform.platform(),
                       "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                       "config": {"seconds": args.seconds, "threads": args.threads, "supervisor_poll_s":
                                  SUPERVISOR_POLL_S, "abort_poll_s": ABORT_POLL_S, "report_every_s": REPORT_EVERY_S,
                                  "beat_every_s": HEARTBEAT_S,
                                  "progress_every_s": PROGRESS_EVERY_S, "output_bytes_per_rank_s":
                                  LINES_PER_PRINT * LINE_BYTES / PRINT_EVERY_S, "warmup_s": WARMUP_S},
                       "sizes": rows, "linear": linear, "goals": goals}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
