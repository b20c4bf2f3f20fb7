"""Steady-state training speed: the same DDP (and Horovod) loop under spark_dist, ``torchrun`` and ``horovodrun``.

    python bench/bench_steady.py [--steps 200] [--warmup 20] [--repeat 3] [--threads N] [--out results.json]
                                 [--launchers spark_dist,torchrun,spark_dist_horovod,horovodrun] [--watch-listeners]

One training loop (``steady_loop`` below), 2 ranks on the 2 cores of this machine, gloo, CPU: an MLP
(``--features`` inputs, ``--layers`` hidden layers of ``--hidden``, 10 classes; the defaults make a step take
~20 ms per rank on an idle 2-core box) trained with SGD on one fixed-seed in-memory batch of ``--batch`` rows
per rank. No data loader: only what the launcher does to the ranks (threads, environment, CPU affinity,
processes beside them) can change the speed. Each rank runs ``--warmup`` steps, a barrier, ``--steps`` timed
steps (forward, backward, gradient all-reduce, optimizer step), a barrier; rank 0's steps/s is the figure.

Launchers, run alternately for ``--repeat`` rounds (the median and the best of the rounds are reported):

  1. spark_dist ``Distributor(2, backend="ddp").run(steady_loop, ...)`` on a ``local[2]`` SparkSession;
  2. ``torchrun --nproc_per_node=2 --master_addr=127.0.0.1`` running this file (``--worker ddp``);
  3. spark_dist ``Distributor(2, backend="horovod")``, the same loop with ``hvd.DistributedOptimizer``;
  4. the same on ``spark_dist.horovod``, Horovod's API on torch.distributed (``spark.dist.horovod.impl=torch``):
     goal >= 1.0x horovodrun's steps/s (issue #58);
  5. ``horovodrun --gloo -np 2 -H localhost:2 --network-interface lo`` running this file (``--worker horovod``).

Threads, like for like: PySpark sets ``OMP_NUM_THREADS`` to ``spark.task.cpus`` (1) in its Python workers,
torchrun sets it to 1 when ``nproc_per_node > 1``, horovodrun leaves it alone (torch then starts one thread
per core in each rank: 4 threads on 2 cores). So every rank calls ``torch.set_num_threads(--threads)``
(default: cores / ranks = 1) before it builds the model; ``--threads 0`` keeps whatever the launcher gave,
to measure the launchers' defaults instead. The tables show, per launcher, the threads each rank started
with and used, ``OMP_NUM_THREADS`` and the CPU affinity, as the ranks saw them.

Loopback only: Spark binds 127.0.0.1 (``SPARK_LOCAL_IP``, ``spark.driver.host``); spark_dist's store and its
Horovod rendezvous bind the driver's address. torchrun's store (a TCPStore, which listens on every
interface whatever host it is given) is handed a socket bound on 127.0.0.1 (``--torchrun`` mode of this file:
torchrun's own ``main`` with that one change); horovodrun's rendezvous server gets the ``find_port`` of
bench/bench_horovod.py's sitecustomize; gloo uses ``lo`` everywhere (``GLOO_SOCKET_IFNAME``,
``HOROVOD_GLOO_IFACE``). ``--watch-listeners`` reports any listening socket of ours not on loopback.

When Horovod is not importable (its wheel not built yet, say), the Horovod rows are skipped with the reason.
Prints a markdown table; ``--out FILE`` also writes the figures as JSON (``make bench-steady``).
"""
import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
GOAL = 0.97  # spark_dist's steps/s at least 97% of the plain launcher's: "within 3%"
LAUNCHERS = ("spark_dist", "torchrun", "spark_dist_horovod", "spark_dist_horovod_torch", "horovodrun")
LABELS = {
    "spark_dist": 'spark_dist `Distributor(2, backend="ddp")`',
    "torchrun": "`torchrun --nproc_per_node=2`",
    "spark_dist_horovod": 'spark_dist `Distributor(2, backend="horovod")`',
    "spark_dist_horovod_torch": 'the same on `spark_dist.horovod` (`spark.dist.horovod.impl=torch`, no build)',
    "horovodrun": "`horovodrun --gloo -np 2`",
}
PAIRS = (("spark_dist", "torchrun", "DDP"), ("spark_dist_horovod", "horovodrun", "Horovod"),
         ("spark_dist_horovod_torch", "horovodrun", "Horovod's API on torch.distributed"))
PAIR_GOALS = {"spark_dist_horovod_torch/horovodrun": 1.0}  # issue #58: at least real Horovod's steps/s


# -- what the ranks run (module-level: pickled by value from __main__, or run by torchrun / horovodrun) ---------
def steady_loop(backend, cfg):
    """Train the MLP for cfg["warmup"] + cfg["steps"] steps on this rank; rank 0 returns its timing and every
    rank's threads, OMP_NUM_THREADS and affinity (the others None). ``backend``: "ddp" (gloo) or "horovod"."""
    import torch

    launched = {"threads_launched": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
                "affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0), "pid": os.getpid()}
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])

    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank and under every launcher
    dims = [cfg["features"]] + [cfg["hidden"]] * cfg["layers"]
    layers = []
    for fan_in, fan_out in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)

    if backend == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(model)
        barrier, finish = dist.barrier, dist.destroy_process_group
        ranks = [None] * dist.get_world_size()
        # Here, not after the loop: a ProcessGroupGloo freed right after a collective on Python-made tensors
        # (all_gather_object's) can deadlock (its destructor joins a gloo thread that waits for the GIL to
        # release those tensors), as seen 1 run in ~5 here; the last collective is a barrier instead.
        dist.all_gather_object(ranks, {**launched, "rank": rank, "threads_used": torch.get_num_threads()})
    else:
        import horovod.torch as hvd

        hvd.init()
        rank = hvd.rank()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        barrier, finish = hvd.barrier, hvd.shutdown
        ranks = hvd.allgather_object({**launched, "rank": rank, "threads_used": torch.get_num_threads()})

    generator = torch.Generator().manual_seed(cfg["seed"] + 1 + rank)  # this rank's own fixed batch
    x = torch.randn(cfg["batch"], cfg["features"], generator=generator)
    y = torch.randint(0, 10, (cfg["batch"],), generator=generator)

    def step():
        optimizer.zero_grad()  # set_to_none (the default); Horovod's takes no argument
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # DDP: the gradient all-reduce overlaps this
        optimizer.step()  # Horovod: waits for its all-reduces here
        return loss

    for _ in range(cfg["warmup"]):
        step()
    step_seconds = []
    barrier()
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        before = time.perf_counter()
        loss = step()
        step_seconds.append(time.perf_counter() - before)
    barrier()
    elapsed = time.perf_counter() - start
    final_loss = float(loss.detach())
    parameters = sum(p.numel() for p in model.parameters())
    del model, optimizer, loss
    finish()
    if rank != 0:
        return None
    return {"steps_per_s": cfg["steps"] / elapsed, "ms_per_step": 1000 * elapsed / cfg["steps"],
            "median_step_ms": 1000 * statistics.median(step_seconds), "final_loss": final_loss,
            "parameters": parameters, "ranks": ranks}


def worker_main(backend, cfg, result_path):
    """``--worker``: a rank started by torchrun / horovodrun; rank 0 writes the figures to ``result_path``."""
    result = steady_loop(backend, cfg)
    if result is not None:
        with open(result_path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(result_path + ".tmp", result_path)


def torchrun_on_loopback(argv):
    """``--torchrun``: torchrun's own ``main(argv)``, its static-rendezvous TCPStore listening on 127.0.0.1 only
    (a TCPStore server listens on every interface whatever host it is given; a bound socket keeps it on one)."""
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    from torch.distributed import TCPStore
    from torch.distributed.run import main

    def loopback_store(host, port, world_size, is_master, *args, **kwargs):
        if not is_master:
            return TCPStore(host, port, world_size, is_master, *args, **kwargs)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        store = TCPStore(host, port, world_size, is_master, *args, master_listen_fd=sock.fileno(), **kwargs)
        sock.detach()  # the store owns the socket now
        return store

    static.TCPStore = loopback_store
    main(argv)


# -- the launchers (driver side) ---------------------------------------------------------------------------------
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_command(name, command, env, result_path, timeout):
    # Its own process group: on a timeout the launcher and the ranks it started go together.
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{name} took over {timeout:.0f} s:\n{output[-3000:]}") from None
    if proc.returncode != 0 or not os.path.exists(result_path):
        raise RuntimeError(f"{name} exited {proc.returncode}:\n{output[-3000:]}")
    with open(result_path) as f:
        result = json.load(f)
    os.remove(result_path)
    return result


def make_launchers(args, cfg, tmp, patch_dir):
    """name -> a function running one measurement and returning rank 0's figures."""
    from spark_dist import Distributor

    cfg_path = os.path.join(tmp, "config.json")  # a file: horovodrun passes its command through a shell
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    result_path = os.path.join(tmp, "result.json")
    gloo_lo = {"GLOO_SOCKET_IFNAME": "lo", "HOROVOD_GLOO_IFACE": "lo"}

    def spark_dist_run(backend, impl=None):
        from pyspark.sql import SparkSession

        from spark_dist.config import CONF_HOROVOD_IMPL

        spark = SparkSession.getActiveSession()
        if impl is not None:  # which horovod.torch the ranks import, for this run only
            spark.conf.set(CONF_HOROVOD_IMPL, impl)
        try:
            return Distributor(num_processes=2, backend=backend, verbose=False, timeout=args.timeout).run(
                steady_loop, backend, cfg)
        finally:
            spark.conf.unset(CONF_HOROVOD_IMPL)

    def torchrun():
        command = [sys.executable, HERE, "--torchrun", "--nnodes=1", "--nproc_per_node=2",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                   HERE, "--worker", "ddp", "--result", result_path, "--config", cfg_path]
        return run_command("torchrun", command, {**os.environ, **gloo_lo}, result_path, args.timeout)

    def horovodrun():
        python_path = os.pathsep.join(p for p in [patch_dir, os.environ.get("PYTHONPATH")] if p)
        command = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--gloo", "-np", "2",
                   "-H", "localhost:2", "--network-interface", "lo",
                   sys.executable, HERE, "--worker", "horovod", "--result", result_path, "--config", cfg_path]
        env = {**os.environ, **gloo_lo, "PYTHONPATH": python_path}
        return run_command("horovodrun", command, env, result_path, args.timeout)

    return {"spark_dist": lambda: spark_dist_run("ddp"), "torchrun": torchrun,
            "spark_dist_horovod": lambda: spark_dist_run("horovod", "horovod"),
            "spark_dist_horovod_torch": lambda: spark_dist_run("horovod", "torch"), "horovodrun": horovodrun}


def horovod_missing():
    """Why Horovod cannot run here, or None."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        return "horovod.torch is not importable: " + (probe.stdout.strip().splitlines() or ["?"])[-1]
    if not os.path.exists(horovodrun):
        return f"no horovodrun beside {sys.executable}"
    return None


def summarize(runs):
    rates = [r["steps_per_s"] for r in runs]
    median = statistics.median(rates)
    return {"steps_per_s_median": median, "steps_per_s_best": max(rates), "ms_per_step_median": 1000 / median,
            "steps_per_s_runs": rates}


def describe_threads(result):
    """"launched -> used" threads, OMP_NUM_THREADS and affinity of the ranks (one entry when they agree)."""
    def one(key, fmt=str):
        values = sorted({fmt(r[key]) for r in result["ranks"]})
        return "/".join(values)

    return {"threads": f"{one('threads_launched')} -> {one('threads_used')}",
            "omp": one("OMP_NUM_THREADS", lambda v: "unset" if v is None else v),
            "affinity": one("affinity", lambda cpus: ",".join(map(str, cpus)))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each launcher runs once per round")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="torch threads per rank (default: cores / 2 ranks); 0: as the launcher left them")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2, help="hidden layers")
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128, help="rows per rank and step")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="comma-separated subset of "
                        + ", ".join(LAUNCHERS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--watch-listeners", action="store_true",
                        help="report listening sockets of our processes that are not on loopback")
    args = parser.parse_args()
    wanted = [n for n in args.launchers.split(",") if n]
    unknown = set(wanted) - set(LAUNCHERS)
    if unknown:
        parser.error(f"unknown launchers: {', '.join(sorted(unknown))}")
    cfg = {"steps": args.steps, "warmup": args.warmup, "threads": args.threads, "hidden": args.hidden,
           "layers": args.layers, "features": args.features, "batch": args.batch, "lr": 0.01, "seed": 0}

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(HERE))
    from bench_horovod import LOOPBACK_SITECUSTOMIZE, ListenerWatch

    skipped = {}
    if {"spark_dist_horovod", "horovodrun"} & set(wanted):
        reason = horovod_missing()
        if reason:
            print(f"Skipping the Horovod rows: {reason}", flush=True)
            skipped = {n: reason for n in wanted if n in ("spark_dist_horovod", "horovodrun")}
            wanted = [n for n in wanted if n not in skipped]

    from pyspark.sql import SparkSession

    watch = ListenerWatch() if args.watch_listeners else None
    if watch:
        watch.start()
    load_before = os.getloadavg()
    runs = {n: [] for n in wanted}
    errors = {}
    spark = None
    with tempfile.TemporaryDirectory(prefix="bench_steady-") as tmp:
        patch_dir = os.path.join(tmp, "site")
        os.makedirs(patch_dir)
        with open(os.path.join(patch_dir, "sitecustomize.py"), "w") as f:
            f.write(LOOPBACK_SITECUSTOMIZE)
        try:
            if {"spark_dist", "spark_dist_horovod", "spark_dist_horovod_torch"} & set(wanted):
                spark = (SparkSession.builder.master("local[2]").appName("bench_steady")
                         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                         .getOrCreate())
                spark.sparkContext.setLogLevel("ERROR")
                spark.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect()  # warm Python workers
            launchers = make_launchers(args, cfg, tmp, patch_dir)
            for round_ in range(args.repeat):
                for name in wanted:
                    if name in errors:
                        continue
                    started = time.perf_counter()
                    try:
                        result = launchers[name]()
                    except Exception as e:  # report it, keep the other launchers' figures
                        errors[name] = f"{type(e).__name__}: {e}"
                        print(f"round {round_ + 1}: {name} failed: {errors[name]}", flush=True)
                        continue
                    result["wall_s"] = time.perf_counter() - started
                    runs[name].append(result)
                    print(f"round {round_ + 1}: {name:<18} {result['steps_per_s']:6.2f} steps/s "
                          f"({result['ms_per_step']:.1f} ms/step, run {result['wall_s']:.1f} s)", flush=True)
        finally:
            if spark is not None:
                spark.stop()
            if watch:
                watch.stop()

    figures = {n: {**summarize(r), **describe_threads(r[-1]), "runs": r} for n, r in runs.items() if r}
    ratios = {}
    for ours, theirs, _ in PAIRS:
        if ours in figures and theirs in figures:
            ratio = figures[ours]["steps_per_s_median"] / figures[theirs]["steps_per_s_median"]
            # Each round's pair ran back to back, so its ratio shares that minute's load: their spread says how
            # far one run's ratio can stray on this machine.
            per_round = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(runs[ours], runs[theirs])]
            goal = PAIR_GOALS.get(f"{ours}/{theirs}", GOAL)
            ratios[f"{ours}/{theirs}"] = {"ratio": ratio, "meets_goal": ratio >= goal, "goal": goal,
                                          "round_ratios": per_round}
    any_run = next((r[0] for r in runs.values() if r), None)

    print(f"\nSteady state: 2 ranks, gloo, CPU, MLP {cfg['features']}-{'-'.join([str(cfg['hidden'])] * cfg['layers'])}"
          f"-10 ({any_run['parameters'] if any_run else '?'} parameters), batch {cfg['batch']} per rank, "
          f"{cfg['steps']} timed steps after {cfg['warmup']}; median of {args.repeat} rounds; "
          f"torch threads per rank: {cfg['threads'] or 'as launched'}\n")
    print("| launcher | steps/s (median) | best | ms/step | threads per rank (launched -> used) "
          "| OMP_NUM_THREADS | CPU affinity |")
    print("|---|---:|---:|---:|---|---|---|")
    for name in LAUNCHERS:
        if name in figures:
            f = figures[name]
            print(f"| {LABELS[name]} | {f['steps_per_s_median']:.2f} | {f['steps_per_s_best']:.2f} "
                  f"| {f['ms_per_step_median']:.1f} | {f['threads']} | {f['omp']} | {f['affinity']} |")
        elif name in skipped or name in errors:
            print(f"| {LABELS[name]} | {'skipped' if name in skipped else 'failed'} | | | | | |")
    for ours, theirs, label in PAIRS:
        key = f"{ours}/{theirs}"
        if key in ratios:
            r = ratios[key]
            verdict = "met" if r["meets_goal"] else "missed"
            print(f"| **{label}: spark_dist / {theirs}** | **{r['ratio']:.3f}** | | | goal >= {r['goal']}: {verdict} "
                  f"(per round {', '.join(f'{x:.3f}' for x in r['round_ratios'])}) | | |")
    for name, reason in {**skipped, **errors}.items():
        print(f"\n{name}: {'skipped' if name in skipped else 'failed'}: {reason}")
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} CPUs")
    if watch:
        print(f"non-loopback listeners seen in {watch.samples} samples: {sorted(watch.found) or 'none'}")

    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"config": {**cfg, "repeat": args.repeat, "ranks": 2}, "figures": figures, "ratios": ratios,
                       "goal_ratio": GOAL, "skipped": skipped, "errors": errors,
                       "environment": {"python": platform.python_version(), "machine": platform.platform(),
                                       "cpus": os.cpu_count(), "load_before": load_before,
                                       "load_after": load_after},
                       **({"non_loopback_listeners": sorted(watch.found)} if watch else {}),
                       "when": time.strftime("%Y-%m-%d %H:%M")}, f, indent=2)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--torchrun":
        torchrun_on_loopback(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker = argparse.ArgumentParser()
        worker.add_argument("--worker", choices=("ddp", "horovod"), required=True)
        worker.add_argument("--result", required=True)
        worker.add_argument("--config", required=True, help="a JSON file: the loop's settings")
        w = worker.parse_args()
        with open(w.config) as f:
            worker_main(w.worker, json.load(f), w.result)
    else:
        sys.exit(main())
