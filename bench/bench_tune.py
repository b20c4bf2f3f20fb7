"""Hyperparameter search on the 2-worker standalone cluster (``make bench-tune``): the same objective, the same
number of trials, side by side in one run.

The objective: an MLP (32 -> hidden -> hidden -> 1, ``hidden`` and the SGD learning rate sampled) trained for a few
epochs on an in-memory tensor dataset (made from a fixed seed), its validation loss reported every epoch so that
a MedianPruner can stop it; one torch thread per process. The ways:

- ``tune_1rank``: ``spark_dist.tune.optimize`` with 1-rank trials, as many at once as the 2 slots allow;
- ``mlflow``: MLflow's ``MlflowSparkStudy`` (``mlflow.pyspark.optuna``), ``n_jobs=2``: two Spark tasks, each
  running its share of the trials one after another inside the task, the study in ``MlflowStorage``;
- ``sequential_1rank``: ``optimize`` with 1-rank trials and ``max_concurrent=1``;
- ``tune_2rank``: ``optimize`` with 2-rank (DDP) trials, as many at once as the slots allow (1 on 2 slots);
- ``sequential_2rank``: the same with ``max_concurrent=1``.

Per way: wall seconds of the ``optimize`` call, trials complete / pruned / failed, trial-epochs run against
those of an unpruned study, the most trials seen at once, and "slots busy": the sum over trials of (trial
duration x ranks) over (wall x 2 slots), the durations from the trials' ``datetime_start`` /
``datetime_complete`` in the study; "slots training", the same from each trial's training start (rank 0 writes
the time to a file) to its end, which leaves out launches and waits for slots. Goals (#43): slots busy >= 80%;
wall time of ``tune_1rank`` at or below MlflowSparkStudy's. Optuna reseeds the sampler of a study run with
``n_jobs > 1`` (MlflowSparkStudy its tasks' samplers), so only the ways that run one trial at a time draw the same
parameters.
"""
import argparse
import math
import os
import platform
import tempfile
import time

from _cluster import median, save, standalone_session

ROWS, FEATURES, BATCH = 16000, 32, 64
SLOTS = 2
WAYS = ("tune_1rank", "mlflow", "sequential_1rank", "tune_2rank", "sequential_2rank")


# -- the objective ----------------------------------------------------------------------------------------------
def fit(lr, hidden, epochs, report, rank=0, world=1):
    """Train the MLP on this rank's share of the training rows (DDP when ``world > 1``; the process group is
    the caller's); ``report(epoch, val_loss)`` after each epoch; returns the last validation loss."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = torch.tanh(x @ torch.randn(FEATURES, 1, generator=g)) + 0.1 * torch.randn(ROWS, 1, generator=g)
    split = ROWS * 4 // 5
    train_x, train_y, val_x, val_y = x[:split][rank::world], y[:split][rank::world], x[split:], y[split:]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    val = float("nan")
    for epoch in range(epochs):
        for i in range(0, len(train_x), BATCH):
            optimizer.zero_grad()
            loss_fn(model(train_x[i:i + BATCH]), train_y[i:i + BATCH]).backward()
            optimizer.step()
        with torch.no_grad():
            val = loss_fn(model(val_x), val_y).item()
        val = val if math.isfinite(val) else 1e3  # a diverged run: a bad value, not a failed trial
        report(epoch, val)
    return val


def suggest(trial):
    return trial.suggest_float("lr", 1e-3, 0.5, log=True), trial.suggest_int("hidden", 8, 128, log=True)


def stamp(path):
    """When the training starts, in a file the driver reads (the executors share this machine's disk)."""
    if path:
        with open(path, "w") as f:
            f.write(repr(time.time()))


def tune_train(lr, hidden, epochs, stamp_path=None):
    """A spark_dist trial's training, on every rank: rank 0 reports each epoch's validation loss."""
    import torch.distributed as dist

    from spark_dist import get_context

    ctx = get_context()
    if ctx.world_size > 1:
        dist.init_process_group("gloo")
    if ctx.rank == 0:
        stamp(stamp_path)

    def report(epoch, val_loss):
        if ctx.rank == 0:
            ctx.report(epoch=epoch, val_loss=val_loss)

    return fit(lr, hidden, epochs, report, ctx.rank, ctx.world_size)


def mlflow_objective(epochs, stamps):
    """The same training inside MlflowSparkStudy's Spark task: each epoch to ``trial.report`` and the pruner."""
    def objective(trial):
        import optuna

        stamp(os.path.join(stamps, f"mlflow-{trial.number}"))

        def report(epoch, val_loss):
            trial.report(val_loss, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {epoch}")

        return fit(*suggest(trial), epochs, report)
    return objective


def sampler_and_pruner(seed):
    import optuna

    return (optuna.samplers.RandomSampler(seed=seed),
            optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))


# -- what a study did -------------------------------------------------------------------------------------------
def peak_overlap(intervals):
    """The most intervals open at one time."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def training_start(stamps, way, number):
    try:
        with open(os.path.join(stamps, f"{way}-{number}")) as f:
            return float(f.read())
    except (OSError, ValueError):  # a trial pruned or failed before its training started
        return None


def summary(trials, wall, ranks, epochs, stamps, way):
    """A way's figures from its study's trials and the wall seconds of its optimize call. Besides "slots busy"
    (trial durations), "slots training": from each trial's training start (its stamp) to its end, which leaves
    out the trial's launch and any wait for slots."""
    trials = sorted(trials, key=lambda t: t.number)
    ended = [t for t in trials if t.datetime_start is not None and t.datetime_complete is not None]
    intervals = [(t.datetime_start.timestamp(), t.datetime_complete.timestamp()) for t in ended]
    durations = [end - start for start, end in intervals]
    starts = [training_start(stamps, way, t.number) for t in ended]
    training = [max(end - max(start, s), 0.0) for (start, end), s in zip(intervals, starts) if s is not None]
    to_training = [max(s - start, 0.0) for (start, _), s in zip(intervals, starts) if s is not None]
    states = [t.state.name for t in trials]
    run_epochs = sum(len(t.intermediate_values) for t in trials)
    unpruned = len(trials) * epochs
    values = [t.value for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    return {
        "ranks": ranks, "wall_s": wall, "trials": len(trials), "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"), "failed": states.count("FAIL"),
        "trial_epochs": run_epochs, "trial_epochs_unpruned": unpruned,
        "epochs_saved": 1 - run_epochs / unpruned if unpruned else 0.0,
        "slots_busy": sum(durations) * ranks / (wall * SLOTS), "peak_trials_at_once": peak_overlap(intervals),
        "slots_training": sum(training) * ranks / (wall * SLOTS),
        "start_to_training_median_s": median(to_training) if to_training else None,
        "trial_seconds_median": median(durations) if durations else None,
        "best_value": min(values) if values else None,
        "trials_detail": [{"number": t.number, "state": t.state.name, "params": t.params,
                           "epochs": len(t.intermediate_values), "value": t.value,
                           "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                           if t.datetime_start and t.datetime_complete else None} for t in trials],
    }


# -- the ways ---------------------------------------------------------------------------------------------------
def tune_way(storage, stamps, name, n_trials, epochs, ranks, max_concurrent, seed):
    import optuna

    from spark_dist.tune import optimize

    sampler, pruner = sampler_and_pruner(seed)
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=sampler,
                                pruner=pruner)

    def objective(trial):
        return tune_train, (*suggest(trial), epochs, os.path.join(stamps, f"{name}-{trial.number}"))

    t0 = time.perf_counter()
    optimize(study, objective, n_trials, num_processes=ranks, metric="val_loss", max_concurrent=max_concurrent)
    return summary(study.trials, time.perf_counter() - t0, ranks, epochs, stamps, name)


def mlflow_way(tmp, stamps, n_trials, epochs, seed):
    """MlflowSparkStudy with ``n_jobs=SLOTS``; MLflow's tracking URI is unset afterwards, so that the other ways'
    runs do not log to MLflow."""
    import mlflow
    from mlflow.optuna.storage import MlflowStorage
    from mlflow.pyspark.optuna.study import MlflowSparkStudy

    mlflow.set_tracking_uri(f"sqlite:///{os.path.join(tmp, 'mlflow.db')}")
    try:
        experiment_id = mlflow.create_experiment("bench_tune")  # the database's schema made before the timing
        sampler, pruner = sampler_and_pruner(seed)
        study = MlflowSparkStudy("bench_tune", MlflowStorage(experiment_id=experiment_id), sampler=sampler,
                                 pruner=pruner, direction="minimize")
        t0 = time.perf_counter()
        study.optimize(mlflow_objective(epochs, stamps), n_trials=n_trials, n_jobs=SLOTS)
        wall = time.perf_counter() - t0
        return summary(study._study.trials, wall, 1, epochs, stamps, "mlflow")
    finally:
        mlflow.set_tracking_uri(None)


def warm(spark):
    """Both kinds of Spark work once before the timing: a spark_dist run (rank processes, torch imported) and a
    Python task importing what MlflowSparkStudy's tasks import."""
    from spark_dist import Distributor

    def imports(batches):
        import mlflow  # noqa: F401
        import optuna  # noqa: F401
        import torch  # noqa: F401
        yield from batches

    Distributor(num_processes=2, verbose=False).run(tune_train, 1e-2, 8, 1)
    spark.range(SLOTS, numPartitions=SLOTS).mapInPandas(imports, "id long").collect()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--out")
    args = parser.parse_args()
    import pyspark
    import torch

    t_start, load_before = time.perf_counter(), os.getloadavg()[0]
    ways = {}
    with standalone_session("bench_tune") as spark, tempfile.TemporaryDirectory(prefix="bench_tune-") as tmp:
        storage = f"sqlite:///{os.path.join(tmp, 'optuna.db')}"
        stamps = os.path.join(tmp, "stamps")
        os.makedirs(stamps)
        warm(spark)
        for way in args.ways:
            print(f"{way}: {args.trials} trials ...", flush=True)
            if way == "mlflow":
                ways[way] = mlflow_way(tmp, stamps, args.trials, args.epochs, args.seed)
            else:
                ranks = 2 if way.endswith("2rank") else 1
                ways[way] = tune_way(storage, stamps, way, args.trials, args.epochs, ranks,
                                     1 if way.startswith("sequential") else None, args.seed)
    ratios = {}
    for name, (a, b) in {"tune/mlflow": ("tune_1rank", "mlflow"),
                         "tune/sequential, 1 rank": ("tune_1rank", "sequential_1rank"),
                         "tune/sequential, 2 ranks": ("tune_2rank", "sequential_2rank")}.items():
        if a in ways and b in ways:
            ratios[name] = ways[a]["wall_s"] / ways[b]["wall_s"]
    line = pyspark.__version__.split(".")[0]
    line = line if int(line) >= 4 else ".".join(pyspark.__version__.split(".")[:2])
    report = {"date": time.strftime("%Y-%m-%d"), "spark": pyspark.__version__, "line": line,
              "config": {"trials": args.trials, "epochs": args.epochs, "seed": args.seed, "slots": SLOTS,
                         "rows": ROWS, "features": FEATURES, "batch": BATCH,
                         "sampler": f"RandomSampler(seed={args.seed})",
                         "pruner": "MedianPruner(n_startup_trials=2, n_warmup_steps=1)"},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
              "ways": ways, "wall_ratios": ratios, "seconds": time.perf_counter() - t_start,
              "load_average": [load_before, os.getloadavg()[0]]}  # other work on the machine skews the seconds
    save(args.out, report)
    print("| way | ranks | trials at once | wall | complete / pruned / failed | trial-epochs run / unpruned "
          "(saved) | slots busy; training |\n|---|---:|---:|---:|---|---|---:|")
    for name, w in ways.items():
        print(f"| {name} | {w['ranks']} | {w['peak_trials_at_once']} | {w['wall_s']:.1f} s | {w['complete']} / "
              f"{w['pruned']} / {w['failed']} | {w['trial_epochs']} / {w['trial_epochs_unpruned']} "
              f"({w['epochs_saved']:.0%}) | {w['slots_busy']:.0%}; {w['slots_training']:.0%} |")
    for name, ratio in ratios.items():
        print(f"wall, {name}: {ratio:.2f}x")
    return report


if __name__ == "__main__":
    main()
