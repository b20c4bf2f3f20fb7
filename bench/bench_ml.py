"""spark_dist.ml benchmarks (a script, not a test).

    python bench/bench_ml.py [--rows 200000] [--baseline-rows 40000] [--repeat 3] [--fits 3] [--out FILE]

On a ``local[2]`` SparkSession (loopback only):

  1. ``TorchModel.transform`` throughput: a 64-64-10 MLP over ``--rows`` cached rows of sklearn's digits
     (a 64-value ML vector column, as VectorAssembler makes it), forced with the ``noop`` sink, against a
     row-by-row predictor the way Horovod's ``TorchModel._transform`` does it: ``df.rdd.mapPartitions``, the
     model unpickled once per partition, one forward pass and one ``Row`` per row (here with the schema
     given, sparing the baseline Horovod's extra schema-inference job). Rows/s: median of ``--repeat``
     runs after one warm-up each. Goal: >= 20x.
  2. ``fit`` wall time of the digits job: ``Pipeline([VectorAssembler(64 columns), TorchEstimator(64-64-10
     MLP, 2 ranks, DDP, 15 epochs, batchSize 32, lr 0.003)])`` on 80% of the rows, with the held-out
     accuracy; timed is ``fit()`` alone (the Pipeline and its model are built before). Run first, so the
     session's first fit (a JVM that ran one job, no Python worker yet) shows on its own, and again in
     ``--first-fit-sessions`` fresh processes (the figure is the median over all those sessions); then
     ``--fits`` more on other splits (median), each writing its Petastorm cache (a VectorAssembler output
     is a new plan every time); then TorchEstimator alone fitted again on one assembled DataFrame, whose
     cache is reused. Held-out accuracy goal (#17): >= 0.93.
  3. The same first fit in ``--first-fit-sessions`` more fresh processes whose session opts in to
     ``spark.python.daemon.module=spark_dist_daemon`` (docs/speedups.md), taking turns with the sessions of 2.
     so that a slow hour slows both alike.
  4. The floor of those fits: the same training in pure torch, no Spark (:func:`pure_torch_fit`, a fresh
     process of this script with ``--pure-torch``): the same model with the same initial weights, the same
     training rows (each fit's own split, collected after the fit), the same 15 epochs of the same global batches
     (2 ranks x 32 rows: one batch of 64), the same learning-rate ramp and Adam, in one process of one torch
     thread. Timed: the whole process up to its figures printed (start, ``import torch``, the rows read, the
     loop: the floor of a first fit, whose ranks start and import torch), and the loop alone (the floor of a
     later fit, whose ranks fork from Python workers that hold torch already). One such process follows each fit
     of 2. and each pair of fresh sessions of 3., taking turns with them. The goals are ratios to it
     (bench/report.py): a fit's seconds over its floor's.

  5. The first fit's ceiling: in fresh processes taking turns with those of 2. and 3. (``--first-fit-ceiling``),
     what a session's first fit pays besides its loop with no spark_dist in it (:func:`first_fit_ceiling_stages`:
     the split written to Parquet once, then the session's first barrier ``mapInArrow`` stage, its tasks
     importing torch), plus the floor's loop. Spark's first Arrow stage of a session dominates it, as it does a
     first launch (BENCHMARKS.md, Launch).

Each run also times a fresh ``import torch`` (median of 3 processes), the fixed cost that dominates a first fit,
so that runs on different days can be set side by side.

Horovod's own estimator (``horovod.spark.torch.TorchEstimator``) is not run: ``horovod[spark]`` 0.28.1 pins
``pyarrow<11`` (this stack needs pyarrow >= 11 for pyspark 3.5 and petastorm 0.12) and imports
pytorch_lightning; the script reports what importing it says here.

Prints markdown tables; ``--out FILE`` also writes the figures as JSON.
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

PIXELS = [f"p{i}" for i in range(64)]


def mlp(seed=0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


# -- the baseline: Horovod's TorchModel._transform, row by row ------------------------------------------------
def horovod_style_predict(payload, rows):
    """Per partition: unpickle the model; per row: a [1, 64] tensor, a forward pass, a Row."""
    import cloudpickle
    import torch
    from pyspark.ml.linalg import DenseVector
    from pyspark.sql import Row

    model = cloudpickle.loads(payload)
    model.eval()
    for row in rows:
        fields = row.asDict().copy()
        data = torch.tensor([row["features"]], dtype=torch.float32).reshape(1, 64)
        with torch.no_grad():
            pred = model(data)
        fields["rawPrediction"] = DenseVector(pred.reshape(-1).double().numpy())
        fields["prediction"] = float(pred.argmax(dim=1)[0])
        yield Row(**fields)


def baseline_transform(spark, df, module):
    import functools

    import cloudpickle
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType, StructField, StructType

    payload = cloudpickle.dumps(module)
    schema = StructType(df.schema.fields + [StructField("rawPrediction", VectorUDT()),
                                            StructField("prediction", DoubleType())])
    return spark.createDataFrame(df.rdd.mapPartitions(functools.partial(horovod_style_predict, payload)), schema)


def force(df) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def digits_frame(spark):
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    pdf = pd.DataFrame(digits.data / 16.0, columns=PIXELS)
    pdf["label"] = digits.target.astype("int64")
    return spark.createDataFrame(pdf)


def bench_transform(spark, rows, baseline_rows, repeat):
    from pyspark.ml.feature import VectorAssembler

    from spark_dist.ml import TorchModel

    base = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(digits_frame(spark)).select(
        "features", "label")
    copies = -(-rows // 1797)
    big = (spark.range(copies).crossJoin(base).select("features", "label").limit(rows)
           .repartition(2).cache())
    small = big.limit(baseline_rows).repartition(2).cache()
    n_big, n_small = big.count(), small.count()
    module = mlp()
    model = TorchModel(model=module, featuresCol="features", loss="cross_entropy")
    results = {}
    methods = (("spark_dist TorchModel.transform (pandas_udf)", big, model.transform, n_big),
               ("row-by-row rdd.mapPartitions (Horovod's way)", small,
                lambda d: baseline_transform(spark, d, module), n_small))
    for name, df, make, n in methods:
        force(make(df))  # warm-up: Python workers started, model cached where the method caches it
        seconds = [force(make(df)) for _ in range(repeat)]
        results[name] = {"rows": n, "seconds": statistics.median(seconds), "rows_per_s": n / statistics.median(seconds)}
    # Same answers: the two methods agree on the first rows.
    ours = model.transform(small).select("prediction").limit(200).collect()
    theirs = baseline_transform(spark, small, module).select("prediction").limit(200).collect()
    agree = [a[0] for a in ours] == [b[0] for b in theirs]
    big.unpersist()
    small.unpersist()
    names = list(results)
    speedup = results[names[0]]["rows_per_s"] / results[names[1]]["rows_per_s"]
    return {"methods": results, "speedup": speedup, "agree_on_first_rows": agree}


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every live descendant (the JVM, Spark's Python daemon and
    workers, the ranks' launchers), with what each has reaped of its exited children (the ranks): a figure
    that a busy machine changes less than wall time."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@contextlib.contextmanager
def job_counter(spark):
    """Counts the Spark jobs that start inside the block, from every thread (the training run's barrier job
    is submitted from the launcher's own thread)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    before = store.jobsList(None).size()
    yield lambda: store.jobsList(None).size() - before


def bench_fit(spark, fits, reuse=True, floors=None):
    """The fits of 2. (module docstring); with ``floors`` (a directory), each fit's floor of 4. after it, on the
    rows of its split (written there), in ``"pure_torch"`` (the fits' order)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler

    from spark_dist.ml import TorchEstimator

    df = digits_frame(spark)
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    assembler = VectorAssembler(inputCols=PIXELS, outputCol="features")

    def estimator():
        return TorchEstimator(model=mlp(), featuresCol="features", labelCol="label", loss="cross_entropy",
                              epochs=EPOCHS, batchSize=BATCH_SIZE, learningRate=LEARNING_RATE, numProcesses=RANKS,
                              backend="ddp")

    # The Pipeline: every fit writes a Petastorm cache, because VectorAssembler's output is a new plan each
    # time (its Scala UDF is a new object, so Spark never finds two such plans the same).
    # Timed: the fit() call alone. The model and the Pipeline are built first, as a user builds them
    # before fitting (building the first one imports torch on the driver, ~1.2 s, which is not fit's work).
    # The first of these fits is the session's first (no Python worker has run yet).
    # The evaluation after each fit is timed too: the first one after the session's first fit is the session's
    # first pandas_udf (the model's transform), which a user waits for next.
    times, jobs, accuracies, evaluations, cpu, pure_torch = [], [], [], [], [], []
    for i in range(fits + 1):
        train, test = df.randomSplit([0.8, 0.2], seed=100 + i)
        pipeline = Pipeline(stages=[assembler, estimator()])
        cpu_before = tree_cpu_seconds()
        started = time.perf_counter()
        with job_counter(spark) as counted:
            fitted = pipeline.fit(train)
        times.append(time.perf_counter() - started)
        cpu.append(tree_cpu_seconds() - cpu_before)
        jobs.append(counted())
        started = time.perf_counter()
        accuracies.append(evaluator.evaluate(fitted.transform(test)))
        evaluations.append(time.perf_counter() - started)
        if floors is not None:
            pure_torch.append(run_pure_torch(save_rows(train, os.path.join(floors, f"split{i}.npz"))))
    if not fits or not reuse:
        return {"first_fit_seconds": times[0], "first_fit_cpu_seconds": cpu[0],
                "first_fit_accuracy": accuracies[0], "pipeline_seconds": times[1:],
                "pipeline_median": statistics.median(times[1:]) if fits else None,
                "first_evaluation_seconds": evaluations[0]}
    # TorchEstimator alone, fitted again on one DataFrame: its Petastorm cache is reused.
    assembled = assembler.transform(df.randomSplit([0.8, 0.2], seed=100)[0])
    estimator().fit(assembled)
    reused = []
    for _ in range(fits):
        again = estimator()
        started = time.perf_counter()
        again.fit(assembled)
        reused.append(time.perf_counter() - started)
    return {"first_fit_seconds": times[0], "first_fit_accuracy": accuracies[0],
            "pipeline_seconds": times[1:], "spark_jobs_per_fit": jobs,
            "pipeline_median": statistics.median(times[1:]),
            "cache_reused_seconds": reused, "cache_reused_median": statistics.median(reused),
            "held_out_accuracy": accuracies, "training_rows": "80% of 1,797 (randomSplit)",
            **({"pure_torch": pure_torch} if floors is not None else {})}


def source_tree(module_file: str) -> str:
    """The directory a ``spark_dist`` was imported from (the one holding the package)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(module_file)))


def workers_origins(spark) -> dict:
    """Where this session's Python workers import spark_dist from (the ranks start from them, in the same
    directory, with the same PYTHONPATH: a ``python -m`` child puts its working directory before PYTHONPATH),
    and the daemon module that forked them (``spark_dist_daemon`` or PySpark's ``pyspark.daemon``)."""
    return spark.sparkContext.parallelize([0], 1).map(
        lambda _: {"workers_code": source_tree(__import__("spark_dist").__file__),
                   "workers_daemon": sys.modules["__main__"].__spec__.name}).collect()[0]


def first_fits_in_fresh_sessions(sessions: int, master: str, rows_file=None) -> dict:
    """The session's first fit is the one a user waits for most, and the noisiest (JVM warm-up, Python
    workers starting, torch imported in them): measure it in ``sessions`` fresh processes, each its own JVM,
    and in as many that opt in to spark_dist_daemon, the two kinds taking turns; with ``rows_file`` (the first
    fit's split), the floor of 4. after each pair (``"pure_torch"``)."""
    import subprocess

    seconds = {"plain": [], "daemon": [], "pure_torch": [], "ceiling": []}
    for i in range(sessions):
        for kind in (("plain", "daemon", "ceiling") if i % 2 == 0 else ("ceiling", "daemon", "plain")):
            mode = "--first-fit-ceiling" if kind == "ceiling" else "--first-fit-only"
            out = subprocess.run([sys.executable, __file__, mode, "--master", master]
                                 + (["--python-daemon"] if kind == "daemon" else []),
                                 check=True, capture_output=True, text=True).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            seconds[kind].append(figures["ceiling_stages_seconds" if kind == "ceiling" else "first_fit_seconds"])
        if rows_file:
            seconds["pure_torch"].append(run_pure_torch(rows_file))
    return seconds


def import_torch_task(batches):
    import torch  # noqa: F401 -- what a first fit's ranks need before their loop

    yield from batches


def first_fit_ceiling_stages(spark) -> float:
    """What a session's first fit on spark_dist's launch path pays besides its training loop, with no spark_dist
    (the first fit's ceiling, with the floor's loop): the first split assembled and written to Parquet once (the
    fit's cache write), then a barrier ``mapInArrow`` stage of :data:`RANKS` tasks that import torch (the
    session's first Arrow stage, new Python workers, their first ``import torch``). Its seconds."""
    import tempfile

    from pyspark.ml.feature import VectorAssembler

    train, _ = digits_frame(spark).randomSplit([0.8, 0.2], seed=100)
    assembled = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(train)
    with tempfile.TemporaryDirectory(prefix="bench_ml-ceiling-") as tmp:
        started = time.perf_counter()
        assembled.select("features", "label").write.parquet(os.path.join(tmp, "cache"))
        spark.range(0, RANKS, 1, RANKS).mapInArrow(import_torch_task, "id long", barrier=True).count()
        return time.perf_counter() - started


def import_torch_seconds(processes: int = 3) -> float:
    """Median seconds of ``import torch`` in fresh processes: how fast this machine is today."""
    import subprocess

    probe = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    return statistics.median(float(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                                  text=True).stdout) for _ in range(processes))


# -- the floor: the same training in pure torch -------------------------------------------------------------
EPOCHS, BATCH_SIZE, LEARNING_RATE, RANKS = 15, 32, 0.003, 2  # the estimator's below (bench_fit)


def pure_torch_fit(rows_file: str) -> dict:
    """The fit's training in one process, torch only (``--pure-torch``): what ``TorchEstimator`` does on its
    :data:`RANKS` ranks, none of Spark or spark_dist. The rows of ``rows_file`` (``x``: float32 [n, 64], ``y``:
    int64 [n]); the model of :func:`mlp` (the estimator's, so the same initial weights); each epoch shuffled and
    cut into the steps the ranks take together (each rank ``n // RANKS // BATCH_SIZE`` full batches, as its loader
    deals them with ``drop_last``), a step's batch being the ranks' together (their mean losses' averaged
    gradients are the gradient of the joint batch's mean loss); the estimator's learning rate (``learningRate`` x
    ranks, reached by a linear ramp over the first epoch: ``training.learning_rate_at``) and its Adam (torch's
    functional ``adam``, as ``spark_dist.ml.optimizers`` runs it: no ``torch._dynamo``); one torch thread, the
    fastest for a model this small. Returns the seconds of ``import torch`` and of the loop, the steps and the
    last epoch's mean loss."""
    started = time.perf_counter()
    import numpy as np
    import torch
    from torch.nn import functional as F
    from torch.optim.adam import adam

    imported = time.perf_counter() - started
    torch.set_num_threads(1)
    with np.load(rows_file) as rows:
        x, y = torch.from_numpy(rows["x"]), torch.from_numpy(rows["y"])
    model = mlp()
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p), torch.tensor(0.0)) for p in params]
    exp_avgs, exp_avg_sqs, steps = (list(m) for m in zip(*moments))
    per_epoch = len(x) // RANKS // BATCH_SIZE
    batch, target, warmup = RANKS * BATCH_SIZE, LEARNING_RATE * RANKS, per_epoch
    generator = torch.Generator().manual_seed(0)
    step, loss_sum = 0, 0.0
    loop_started = time.perf_counter()
    for _ in range(EPOCHS):
        order = torch.randperm(len(x), generator=generator)
        loss_sum = 0.0
        for i in range(per_epoch):
            picked = order[i * batch:(i + 1) * batch]
            lr = target if step >= warmup else LEARNING_RATE + (target - LEARNING_RATE) * (step + 1) / warmup
            for p in params:
                p.grad = None
            loss = F.cross_entropy(model(x[picked]), y[picked])
            loss.backward()
            with torch.no_grad():
                adam(params, [p.grad for p in params], exp_avgs, exp_avg_sqs, [], steps, foreach=False,
                     capturable=False, differentiable=False, fused=None, grad_scale=None, found_inf=None,
                     has_complex=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=lr, weight_decay=0.0, eps=1e-8,
                     maximize=False)
            loss_sum += float(loss.detach()) * len(picked)
            step += 1
    loop = time.perf_counter() - loop_started
    return {"import_seconds": imported, "loop_seconds": loop, "steps": step,
            "last_epoch_loss": loss_sum / max(per_epoch * batch, 1)}


def save_rows(df, path: str) -> str:
    """A training split's rows (``PIXELS`` and ``label``), collected to ``path`` for :func:`pure_torch_fit`."""
    import numpy as np

    pdf = df.select(*PIXELS, "label").toPandas()
    np.savez(path, x=pdf[PIXELS].to_numpy(dtype="float32"), y=pdf["label"].to_numpy(dtype="int64"))
    return path


def run_pure_torch(rows_file: str) -> dict:
    """:func:`pure_torch_fit` in a fresh process of this script; adds its wall seconds from the start to its
    figures printed, the training done (``process_seconds``; the process's exit after it is not counted)."""
    import subprocess

    started = time.perf_counter()
    with subprocess.Popen([sys.executable, __file__, "--pure-torch", rows_file], stdout=subprocess.PIPE,
                          text=True) as process:
        line = process.stdout.readline()
        seconds = time.perf_counter() - started
        process.communicate()
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, process.args)
    return {**json.loads(line), "process_seconds": seconds}


def floor_figures(fit: dict, fresh_floors: list) -> dict:
    """The fits over their floors (4.): a first fit over the whole floor process (the median of the fresh
    sessions' first fits, this session's included, over the median of the floors that ran beside them), the later
    fits over the floor's loop (median over median); and each fit over the floor that ran right after it."""
    firsts = [fit["first_fit_seconds"], *fit["fresh_session_first_fits"]]
    cold = [fit["pure_torch"][0], *fresh_floors]
    later = fit["pure_torch"][1:]
    cold_median = statistics.median(f["process_seconds"] for f in cold)
    loop_median = statistics.median(f["loop_seconds"] for f in later)
    return {"fresh_session_pure_torch": fresh_floors,
            "pure_torch_process_median": cold_median, "pure_torch_loop_median": loop_median,
            "first_fit_vs_pure_torch": fit["first_fit_median"] / cold_median,
            "first_fit_pair_ratios": [t / f["process_seconds"] for t, f in zip(firsts, cold)],
            "later_fits_vs_pure_torch_loop": fit["pipeline_median"] / loop_median,
            "later_fit_pair_ratios": [t / f["loop_seconds"] for t, f in zip(fit["pipeline_seconds"], later)]}


def horovod_estimator_status() -> str:
    try:
        from importlib.metadata import requires, version

        pins = [r for r in requires("horovod") or [] if r.startswith("pyarrow") and "spark" in r]
        pin = pins[0].split(";")[0] if pins else "?"
        have = version("pyarrow")
    except Exception:  # noqa: BLE001 -- horovod not installed
        return "horovod is not installed"
    try:
        import horovod.spark.torch  # noqa: F401
        importable = "imports"
    except Exception as exc:  # noqa: BLE001
        importable = f"import fails: {type(exc).__name__}: {exc}"
    return (f"not run: horovod[spark] requires {pin}, this stack has pyarrow {have} "
            f"(pyspark 3.5 needs >= 4 and uses 14 here; pyspark 4.x needs >= 11, 4.2+ >= 18); "
            f"horovod.spark.torch {importable}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows for spark_dist's transform")
    parser.add_argument("--baseline-rows", type=int, default=40_000, help="rows for the row-by-row baseline")
    parser.add_argument("--repeat", type=int, default=3, help="timed transform runs per method (median)")
    parser.add_argument("--fits", type=int, default=3, help="cold and warm fits (median of each)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--first-fit-sessions", type=int, default=4,
                        help="fresh sessions (processes) that each time their first fit (median)")
    parser.add_argument("--first-fit-only", action="store_true",
                        help="time this session's first fit only and print it as JSON (used by the above)")
    parser.add_argument("--first-fit-ceiling", action="store_true",
                        help="time the first fit's ceiling stages in this session and print them as JSON (used by "
                             "the above)")
    parser.add_argument("--python-daemon", action="store_true",
                        help="opt this session in to spark_dist_daemon as its PySpark daemon (used by the above)")
    parser.add_argument("--later-fits", type=int, default=0,
                        help="with --first-fit-only: time this many more Pipeline fits after it (median)")
    parser.add_argument("--code", help="with --first-fit-only: import spark_dist from this source tree, in the "
                                       "driver and the ranks, instead of this repository's (bench_history.py)")
    parser.add_argument("--pure-torch", metavar="ROWS_FILE",
                        help="run the fit's training in pure torch on these rows and print its figures as JSON "
                             "(the floor, used by the above)")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if args.pure_torch:  # before anything imports Spark: the floor's process holds torch alone
        print(json.dumps(pure_torch_fit(args.pure_torch)))
        return 0

    import tempfile
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from pyspark.sql import SparkSession

    if args.code:  # first on the path here, and in the ranks, which inherit PYTHONPATH through Spark's JVM
        sys.path.insert(0, args.code)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.code, os.environ.get("PYTHONPATH")) if p)
    builder = (SparkSession.builder.master(args.master).appName("spark_dist bench_ml")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2"))
    if args.python_daemon:
        builder = builder.config("spark.python.daemon.module", "spark_dist_daemon")
    load_before = os.getloadavg()[0]
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # The floors' rows (a file per split): kept until the fresh sessions' floors have run.
    scratch = None if args.first_fit_only or args.first_fit_ceiling else tempfile.TemporaryDirectory(prefix="bench_ml-")
    floors = scratch.name if scratch else None
    try:
        spark.range(1000).selectExpr("sum(id)").collect()  # the JVM's first job out of the way
        if args.first_fit_ceiling:
            print(json.dumps({"ceiling_stages_seconds": first_fit_ceiling_stages(spark)}))
            return 0
        # First: the session's first Python work.
        fit = bench_fit(spark, args.later_fits if args.first_fit_only else args.fits, reuse=not args.first_fit_only,
                        floors=floors)
        if args.first_fit_only:
            import spark_dist

            print(json.dumps({"first_fit_seconds": fit["first_fit_seconds"],
                              "first_fit_cpu_seconds": fit["first_fit_cpu_seconds"],
                              "first_fit_accuracy": fit["first_fit_accuracy"],
                              "first_evaluation_seconds": fit["first_evaluation_seconds"],
                              "later_fits_median": fit["pipeline_median"],
                              "code": source_tree(spark_dist.__file__),
                              **workers_origins(spark)}))
            return 0
        transform = bench_transform(spark, args.rows, args.baseline_rows, args.repeat)
    finally:
        spark.stop()
    with scratch:
        fresh = first_fits_in_fresh_sessions(args.first_fit_sessions, args.master,
                                             os.path.join(scratch.name, "split0.npz"))
    fit["fresh_session_first_fits"] = fresh["plain"]
    # The median over every session's first fit: this one's and the fresh sessions'.
    fit["first_fit_median"] = statistics.median([fit["first_fit_seconds"], *fit["fresh_session_first_fits"]])
    fit["daemon_first_fits"] = fresh["daemon"]
    if fresh["daemon"]:
        fit["daemon_first_fit_median"] = statistics.median(fresh["daemon"])
    fit.update(floor_figures(fit, fresh["pure_torch"]))
    # The first fit's ceiling: its stages (the median of the fresh sessions') and the floor's training loop.
    fit["ceiling_stages_seconds"] = fresh["ceiling"]
    fit["first_fit_ceiling"] = statistics.median(fresh["ceiling"]) + fit["pure_torch_loop_median"]
    fit["first_fit_vs_ceiling"] = fit["first_fit_median"] / fit["first_fit_ceiling"]
    fit["import_torch_seconds"] = import_torch_seconds()
    horovod = horovod_estimator_status()

    print(f"\n### TorchModel.transform, 64-64-10 MLP, {args.master} ({os.cpu_count()} cores)\n")
    print("| method | rows | seconds (median) | rows/s |")
    print("|---|---:|---:|---:|")
    for name, r in transform["methods"].items():
        print(f"| {name} | {r['rows']:,} | {r['seconds']:.2f} | {r['rows_per_s']:,.0f} |")
    print(f"\nspeed-up: **{transform['speedup']:.1f}x** (goal >= 20x); same predictions on the first 200 rows: "
          f"{transform['agree_on_first_rows']}")
    print(f"\n### fit: digits Pipeline (VectorAssembler + TorchEstimator, 2 ranks DDP, 15 epochs), {args.master}\n")
    print("| fit | seconds (median) | all runs |")
    print("|---|---:|---|")
    firsts = [fit["first_fit_seconds"], *fit["fresh_session_first_fits"]]
    print(f"| Pipeline, the session's first fit ({len(firsts)} fresh sessions) | {fit['first_fit_median']:.2f} | "
          f"{', '.join(f'{s:.2f}' for s in firsts)} |")
    if fit["daemon_first_fits"]:
        print(f"| Pipeline, the session's first fit, opted in to spark_dist_daemon ({len(fit['daemon_first_fits'])} "
              f"fresh sessions) | {fit['daemon_first_fit_median']:.2f} | "
              f"{', '.join(f'{s:.2f}' for s in fit['daemon_first_fits'])} |")
    print(f"| Pipeline, later fits (new split each) | {fit['pipeline_median']:.2f} | "
          f"{', '.join(f'{s:.2f}' for s in fit['pipeline_seconds'])} |")
    print(f"| TorchEstimator alone, same DataFrame again (Petastorm cache reused) | {fit['cache_reused_median']:.2f} | "
          f"{', '.join(f'{s:.2f}' for s in fit['cache_reused_seconds'])} |")
    print("\nSpark jobs per Pipeline fit (the cache write, which also checks the values; the training run): "
          + ", ".join(str(j) for j in fit["spark_jobs_per_fit"]))
    print("\nheld-out accuracy of the fits: " + ", ".join(f"{a:.3f}" for a in fit["held_out_accuracy"]))
    print(f"\nthe floor, the same training in pure torch: a fresh process {fit['pure_torch_process_median']:.2f} s "
          f"(median), its loop {fit['pure_torch_loop_median']:.2f} s; first fit / the process "
          f"**{fit['first_fit_vs_pure_torch']:.2f}x**, later fits / the loop "
          f"**{fit['later_fits_vs_pure_torch_loop']:.2f}x** (goals: bench/report.py); the first fit's ceiling "
          f"{fit['first_fit_ceiling']:.2f} s, first fit / ceiling **{fit['first_fit_vs_ceiling']:.2f}x**")
    print(f"\nheld-out accuracy goal >= 0.93. A fresh `import torch` took "
          f"{fit['import_torch_seconds']:.2f} s on this machine today. Horovod's TorchEstimator: " + horovod)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"transform": transform, "fit": fit, "horovod_estimator": horovod, "master": args.master,
                       "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                       "load_average": [load_before, os.getloadavg()[0]]},  # other work on the machine skews it
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
