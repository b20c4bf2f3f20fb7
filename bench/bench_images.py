"""Images per second of four ways to feed a training loop decoded, augmented JPEGs, with each loader's peak
memory; tokens per second of a tokenizer transform (a script, not a test).

    python bench/bench_images.py [--sizes 20000 40000] [--size 64] [--batch-size 128] [--workers 2] [--epochs 2]
                                 [--rounds 2] [--mosaic-python .venv-mosaic/bin/python] [--out results.json]

Data: ``--sizes`` random ``--size`` x ``--size`` RGB JPEGs made with PIL (``bench_transform.make_jpegs``), in a
Parquet file read back as a Spark DataFrame (``image: binary``, ``label: long``) on ``local[2]``.

Transform, the same function in every way (``bench_transform.decode_augment``): decode with PIL, random crop
to 3/4 of the side, random horizontal flip, normalise, stack into one float32 tensor per batch.

Ways, each with ``--workers`` k worker processes, batches of ``--batch-size``, ``--epochs`` shuffled epochs:

  ceiling    ``multiprocessing.Pool(k).imap(decode_augment, batches)`` over the JPEG bytes held in memory:
             no reading, no shuffle; what k processes can do with the function alone
  spark_dist ``make_loader(handle, ..., transform=decode_augment, workers=k)`` over the dataset's cache
             (``prepare_datasets``): what ``ctx.loader(name, batch_size, transform=fn, workers=k)`` returns
  petastorm  ``make_spark_converter(df)`` -> ``make_torch_dataloader(transform_spec=TransformSpec(fn'),
             workers_count=k, reader_pool_type="process")``; ``fn'`` wraps the same function for Petastorm's
             pandas row groups. On the Spark 4 line Petastorm's worker processes import spark_dist first (a
             ``sitecustomize`` on their PYTHONPATH) so that its pyarrow compatibility hook is there
  mosaic     Mosaic Streaming in its own environment (``.venv-mosaic``, ``make env-mosaic``: it needs
             numpy < 2.2, transformers < 5 and torchvision, which neither line's pins allow), run as a
             subprocess on the same files: it converts spark_dist's cache files (the same JPEG bytes) to MDS
             shards with ``MDSWriter`` (what ``dataframe_to_mds`` does in each partition), then reads them with
             ``StreamingDataset(shuffle=True)`` and a torch ``DataLoader(num_workers=k)`` whose ``collate_fn``
             is the same function (so it runs in the k workers, per batch)

Images/s counts from the first batch to the last (start-up is reported apart: to the first batch). The ways
take turns within each of ``--rounds`` rounds at the first size and run once at the others. Memory: the peak
growth, over the consumer process's own before the loader is made, of the memory of the consumer and its
workers (every descendant process), sampled every 50 ms; as PSS (proportional set size: a page shared by n
processes counts 1/n in each, so torch's libraries mapped by every worker count once, which RSS summed over
the processes would count k + 1 times) and as the private anonymous memory (RssAnon) summed. At two sizes,
to show that it does not grow with the dataset.

Text: ``--texts`` made-up sentences (a string column), a BPE tokenizer trained on the fly with Hugging Face
``tokenizers`` (nothing downloaded); the transform encodes a batch, pads the ids into one tensor and adds the
lengths. Tokens/s (the second of 2 epochs) of spark_dist's loader with it (k workers, and 0) against the same function in a plain loop
over the same strings in memory.

``--out FILE`` writes the figures as JSON. ``--mosaic-part`` is the Mosaic side, run by the main part in the
Mosaic environment (no Spark and no spark_dist there).
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

from bench_transform import _one_thread, _one_thread_noop, batched, count, decode_augment, make_jpegs  # noqa: E402

MOSAIC_PYTHON = os.path.join(ROOT, ".venv-mosaic", "bin", "python")


# -- memory of a consumer and its workers ---------------------------------------------------------------------
def _rollup(pid: int) -> dict:
    """PSS and RssAnon (KiB) of one process, from /proc (0s for one that has just exited)."""
    found = {"pss": 0, "anon": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    found["pss"] = int(line.split()[1])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    found["anon"] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return found


def _children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def _descendants(pids) -> list:
    out, todo = [], list(pids)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _tree_sum(before: set) -> dict:
    """PSS and RssAnon (KiB) summed over this process and the processes it started after ``before`` was taken."""
    me = os.getpid()
    total = {"pss": 0, "anon": 0}
    for pid in [me] + _descendants(k for k in _children(me) if k not in before):
        for key, value in _rollup(pid).items():
            total[key] += value
    return total


@contextlib.contextmanager
def tree_memory(interval: float = 0.05):
    """Yields a dict that holds, once the block ends, the peak memory of this process and of the processes it
    starts in the block (with their own descendants; not the children it had before, such as Spark's JVM),
    above this process's own just before, in MiB: ``pss`` and ``anon`` (RssAnon). Sampled every ``interval``."""
    import gc

    gc.collect()
    before, growth = set(_children(os.getpid())), {}
    base = _rollup(os.getpid())
    peak, stop = dict(base), threading.Event()

    def sample():
        while not stop.wait(interval):
            for key, value in _tree_sum(before).items():
                peak[key] = max(peak[key], value)

    thread = threading.Thread(target=sample, daemon=True, name="bench_images-memory")
    thread.start()
    try:
        yield growth
    finally:
        stop.set()
        thread.join()
        growth.update({key: (peak[key] - base[key]) / 1024 for key in base})


def timed_epochs(batches_of_epoch, epochs: int, images_in, stream_epochs: int = 1) -> dict:
    """Runs ``epochs`` epochs (``batches_of_epoch(e)`` an iterable of batches; one iterable may hold
    ``stream_epochs`` epochs, as Petastorm's reader does) under :func:`tree_memory`.

    ``start_s``: to the first batch. ``images_per_s``: the steady rate, over the last epoch's worth of images
    (from the batch that completes the earlier epochs to the end), so that no way is charged for starting its
    workers or filling its pipeline, however it does so (Petastorm transforms a whole row group before its first
    batch). ``run_images_per_s``: every image over the whole run, start-up included."""
    marks = []  # (seconds since the start, images so far) after each batch
    images = 0
    with tree_memory() as mem:
        t0 = time.perf_counter()
        for epoch in range(epochs):
            for batch in batches_of_epoch(epoch):
                images += images_in(batch)
                marks.append((time.perf_counter() - t0, images))
    total_epochs = epochs * stream_epochs
    if total_epochs < 2:
        raise ValueError("the steady rate needs at least 2 epochs")
    cut = images * (total_epochs - 1) / total_epochs
    at_s, at_images = next(m for m in marks if m[1] >= cut)
    end_s = marks[-1][0]
    return {"images": images, "images_per_s": (images - at_images) / (end_s - at_s),
            "run_images_per_s": images / end_s, "start_s": marks[0][0], "seconds": end_s,
            "pss_growth_mib": mem["pss"], "anon_growth_mib": mem["anon"]}


def images_in(batch) -> int:
    return len(batch["label"])


# -- the ways -------------------------------------------------------------------------------------------------
def run_ceiling(jpegs: list, k: int, batch_size: int, epochs: int) -> dict:
    import multiprocessing

    batches = batched(jpegs, batch_size)
    batches = batches[:len(jpegs) // batch_size]  # full batches only, as the loaders yield them

    @contextlib.contextmanager
    def pool_of_k():
        pool = multiprocessing.get_context("fork").Pool(k, initializer=_one_thread)
        try:
            pool.map(_one_thread_noop, range(k))
            yield pool
        finally:
            pool.close()
            pool.join()

    with pool_of_k() as pool:
        return timed_epochs(lambda e: pool.imap(decode_augment, batches), epochs, images_in)


def run_spark_dist(handle, k: int, batch_size: int, epochs: int, transform=decode_augment, count_of=images_in):
    from spark_dist.data import make_loader

    loader = make_loader(handle, rank=0, world_size=1, batch_size=batch_size, transform=transform, workers=k)

    def epoch_of(e):
        loader.set_epoch(e)
        return loader

    try:
        return timed_epochs(epoch_of, epochs, count_of)
    finally:
        loader.close()


def petastorm_transform(pdf):
    """``decode_augment`` on one of Petastorm's row groups (a pandas DataFrame), back as a DataFrame of arrays."""
    import pandas as pd
    from bench_transform import decode_augment as fn  # by name: Petastorm's workers unpickle this by value

    out = fn({"image": list(pdf["image"]), "label": pdf["label"].to_numpy()})
    return pd.DataFrame({"image": list(out["image"].numpy()), "label": out["label"].numpy()})


@contextlib.contextmanager
def spark_dist_in_new_processes():
    """Petastorm's process-pool workers are fresh interpreters: on pyarrow >= 16 they need spark_dist's
    compatibility hook, which ``import spark_dist`` installs (docs/data.md, Limits). A ``sitecustomize`` on
    their PYTHONPATH does it, for the length of the block; the bench's folders are there too, for the transform."""
    with tempfile.TemporaryDirectory(prefix="bench_images-site-") as site:
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write("import spark_dist  # noqa: F401\n")
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([site, ROOT, BENCH] + ([before] if before else []))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before


def run_petastorm(converter, k: int, batch_size: int, epochs: int, side: int) -> dict:
    import numpy as np
    from petastorm import TransformSpec

    crop = side * 3 // 4
    spec = TransformSpec(petastorm_transform, edit_fields=[("image", np.float32, (3, crop, crop), False)])
    with spark_dist_in_new_processes():
        with converter.make_torch_dataloader(batch_size=batch_size, num_epochs=epochs, transform_spec=spec,
                                             workers_count=k, reader_pool_type="process") as loader:
            return timed_epochs(lambda e: loader, 1, images_in, stream_epochs=epochs)


def run_mosaic(python: str, files: list, mds: str, k: int, batch_size: int, epochs: int) -> dict:
    """The Mosaic side in its own environment: converts ``files`` to MDS shards under ``mds`` (once), then
    reads them; its figures come back as JSON on the last line of its output."""
    args = {"files": files, "mds": mds, "workers": k, "batch_size": batch_size, "epochs": epochs}
    proc = subprocess.run([python, os.path.abspath(__file__), "--mosaic-part", json.dumps(args)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"the Mosaic part failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mosaic_part(args: dict) -> dict:
    """Runs in the Mosaic environment: parquet files -> MDS shards (``MDSWriter``, columns image: bytes,
    label: int64), then ``StreamingDataset`` + ``DataLoader(num_workers=k, collate_fn=decode_augment)``."""
    import warnings

    import numpy as np
    import torch

    warnings.filterwarnings("ignore")
    # PyPI's torchvision wheels for Linux are CUDA builds: their compiled ops cannot load beside the CPU
    # torch, and torchvision's Python then registers fake kernels for two ops that do not exist. Mosaic
    # imports torchvision only for ``streaming.vision``, unused here; defining the two schemas lets it import.
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import pyarrow.parquet as pq
    import streaming
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    report = {"streaming": streaming.__version__, "numpy": np.__version__, "torch": torch.__version__}
    if not os.path.exists(os.path.join(args["mds"], "index.json")):
        t0 = time.perf_counter()
        with MDSWriter(out=args["mds"], columns={"image": "bytes", "label": "int64"}) as out:
            for path in args["files"]:
                for rb in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=["image", "label"]):
                    for image, label in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist()):
                        out.write({"image": image, "label": label})
        report["convert_s"] = time.perf_counter() - t0
    clean_stale_shared_memory()

    def collate(samples):
        return decode_augment({"image": [s["image"] for s in samples],
                               "label": np.array([s["label"] for s in samples], dtype=np.int64)})

    dataset = StreamingDataset(local=args["mds"], shuffle=True, shuffle_seed=0, batch_size=args["batch_size"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=args["batch_size"], num_workers=args["workers"],
                                         collate_fn=collate, drop_last=True)
    report.update(timed_epochs(lambda e: loader, args["epochs"], images_in))
    return report


# -- text ------------------------------------------------------------------------------------------------------
def make_texts(n: int, seed: int = 0) -> list:
    """``n`` sentences of 8-64 made-up words (a Zipf-like vocabulary of 5,000), as text a tokenizer meets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(5000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    lengths = rng.integers(8, 65, n)
    words = rng.choice(len(vocab), int(lengths.sum()), p=weights)
    out, at = [], 0
    for length in lengths:
        out.append(" ".join(vocab[i] for i in words[at:at + length]) + ".")
        at += length
    return out


class Tokenize:
    """The text transform: a batch's strings -> ``input_ids`` (padded with 0) and ``lengths``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, batch):
        import torch

        encoded = self.tokenizer.encode_batch(list(batch["text"]))
        lengths = [len(e.ids) for e in encoded]
        ids = torch.zeros(len(encoded), max(lengths), dtype=torch.int64)
        for row, e in enumerate(encoded):
            ids[row, :len(e.ids)] = torch.tensor(e.ids)
        return {"input_ids": ids, "lengths": torch.tensor(lengths)}


def train_tokenizer(texts: list, vocab_size: int = 4000):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]"]))
    return tokenizer


def tokens_in(batch) -> int:
    return int(batch["lengths"].sum())


def measure_text(spark, n: int, k: int, batch_size: int, rounds: int) -> dict:
    from spark_dist.data import clear_cache, prepare_datasets

    texts = make_texts(n)
    tokenizer = train_tokenizer(texts)
    fn = Tokenize(tokenizer)
    df = spark.createDataFrame([(t, i) for i, t in enumerate(texts)], "text string, label long")
    handle = prepare_datasets(spark, {"text": df}, 1)["text"]
    batches = [{"text": texts[i:i + batch_size]} for i in range(0, n - batch_size + 1, batch_size)]
    ways = {
        "plain loop": lambda: timed_epochs(lambda e: map(fn, batches), 2, tokens_in),
        "spark_dist workers=0": lambda: run_spark_dist(handle, 0, batch_size, 2, fn, tokens_in),
        f"spark_dist workers={k}": lambda: run_spark_dist(handle, k, batch_size, 2, fn, tokens_in),
    }
    results = {name: [] for name in ways}
    try:
        for _ in range(rounds):
            for name, way in ways.items():
                results[name].append(way())
    finally:
        clear_cache(spark)
    out = {"texts": n, "tokens_per_text": sum(len(e.ids) for e in tokenizer.encode_batch(texts[:1000])) / 1000,
           "ways": {}}
    for name, runs in results.items():
        out["ways"][name] = {"tokens_per_s": max(r["images_per_s"] for r in runs),
                             "rounds_tokens_per_s": [r["images_per_s"] for r in runs],
                             "start_s": statistics.median(r["start_s"] for r in runs)}
    plain = out["ways"]["plain loop"]
    for name, way in out["ways"].items():
        way["vs_plain_loop"] = way["tokens_per_s"] / plain["tokens_per_s"]
        way["vs_plain_loop_median_round"] = statistics.median(
            a / b for a, b in zip(way["rounds_tokens_per_s"], plain["rounds_tokens_per_s"]))
    return out


# -- the main part -------------------------------------------------------------------------------------------
def image_frame(spark, jpegs: list, where: str):
    """A Spark DataFrame of the JPEGs (``image: binary``, ``label: long``), read from a Parquet file, in a
    partition per 1,000 images (as a folder of image files read by ``binaryFile`` would be split, and so that
    Petastorm's converter writes row groups small enough to share among its workers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(where, "images.parquet")
    pq.write_table(pa.table({"image": pa.array(jpegs, pa.binary()), "label": pa.array(range(len(jpegs)), pa.int64())}),
                   path)
    return spark.read.parquet("file://" + path).repartition(max(2, len(jpegs) // 1000))


def measure_size(spark, n: int, args, rounds: int, tmp: str) -> dict:
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    from spark_dist.data import clear_cache, prepare_datasets
    from spark_dist.data.urls import local_path

    k, bs, epochs = args.workers, args.batch_size, args.epochs
    jpegs = make_jpegs(n, args.size)
    where = tempfile.mkdtemp(prefix=f"n{n}-", dir=tmp)
    df = image_frame(spark, jpegs, where)
    t0 = time.perf_counter()
    handle = prepare_datasets(spark, {"images": df}, 1)["images"]
    prepare_s = time.perf_counter() - t0
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + where)
    t0 = time.perf_counter()
    converter = make_spark_converter(df)
    converter_s = time.perf_counter() - t0
    files = [local_path(u) for u in handle.file_urls]
    mds = os.path.join(where, "mds")
    ways = {
        "ceiling": lambda: run_ceiling(jpegs, k, bs, epochs),
        "spark_dist": lambda: run_spark_dist(handle, k, bs, epochs),
        "petastorm": lambda: run_petastorm(converter, k, bs, epochs, args.size),
    }
    mosaic_skipped = None
    if os.path.exists(args.mosaic_python):
        ways["mosaic"] = lambda: run_mosaic(args.mosaic_python, files, mds, k, bs, epochs)
    else:
        mosaic_skipped = f"{args.mosaic_python} not found: build it with `make env-mosaic`"
    runs = {name: [] for name in ways}
    try:
        for r in range(rounds):
            for name, way in ways.items():
                runs[name].append(way())
                print(f"  {n:,} images, round {r + 1}: {name} {runs[name][-1]['images_per_s']:,.0f} images/s, "
                      f"memory +{runs[name][-1]['pss_growth_mib']:.0f} MiB (PSS)", flush=True)
    finally:
        converter.delete()
        clear_cache(spark)
    out = {"images": n, "jpeg_bytes_mean": sum(map(len, jpegs)) / n, "prepare_s": prepare_s,
           "petastorm_converter_s": converter_s, "ways": {}}
    if mosaic_skipped:
        out["mosaic_skipped"] = mosaic_skipped
    elif runs["mosaic"][0].get("convert_s") is not None:
        out["mosaic_convert_s"] = runs["mosaic"][0]["convert_s"]
        out["mosaic_versions"] = {key: runs["mosaic"][0][key] for key in ("streaming", "numpy", "torch")}
    for name, rs in runs.items():
        out["ways"][name] = {
            "images_per_s": max(r["images_per_s"] for r in rs),
            "rounds_images_per_s": [r["images_per_s"] for r in rs],
            "run_images_per_s": max(r["run_images_per_s"] for r in rs),
            "start_s": statistics.median(r["start_s"] for r in rs),
            "pss_growth_mib": max(r["pss_growth_mib"] for r in rs),
            "anon_growth_mib": max(r["anon_growth_mib"] for r in rs)}
    ceiling = out["ways"]["ceiling"]
    for name, way in out["ways"].items():
        way["vs_ceiling_median_round"] = statistics.median(
            a / b for a, b in zip(way["rounds_images_per_s"], ceiling["rounds_images_per_s"]))
    ours = out["ways"]["spark_dist"]
    out["ratios"] = {f"spark_dist/{name}": statistics.median(
        a / b for a, b in zip(ours["rounds_images_per_s"], way["rounds_images_per_s"]))
        for name, way in out["ways"].items() if name != "spark_dist"}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 40000],
                        help="dataset sizes in images (the first is measured --rounds times)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=int, default=30000)
    parser.add_argument("--mosaic-python", default=MOSAIC_PYTHON)
    parser.add_argument("--mosaic-part", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if args.mosaic_part:
        print(json.dumps(mosaic_part(json.loads(args.mosaic_part))))
        return {}

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this line's environment
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    import pyspark
    import torch
    from pyspark.sql import SparkSession

    import spark_dist  # noqa: F401 -- Petastorm's compatibility hook, as a user has it

    line = pyspark.__version__.split(".")[0]
    line = line if int(line) >= 4 else ".".join(pyspark.__version__.split(".")[:2])
    spark = (SparkSession.builder.master("local[2]").appName("bench_images")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    t_start, load_before = time.perf_counter(), os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="bench_images-") as tmp:
            sizes = [measure_size(spark, n, args, args.rounds if i == 0 else 1, tmp)
                     for i, n in enumerate(args.sizes)]
        text = measure_text(spark, args.texts, args.workers, args.batch_size, args.rounds + 1)
    finally:
        spark.stop()
    report = {"date": time.strftime("%Y-%m-%d"), "spark": pyspark.__version__, "line": line,
              "config": {"size": args.size, "batch_size": args.batch_size, "workers": args.workers,
                         "epochs": args.epochs, "rounds": args.rounds},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
              "sizes": sizes, "text": text, "seconds": time.perf_counter() - t_start,
              "load_average": [load_before, os.getloadavg()[0]]}  # other work on the machine skews the rates
    print_report(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


def print_report(report: dict) -> None:
    c = report["config"]
    print(f"\npyspark {report['spark']}, {c['size']}x{c['size']} JPEGs, batches of {c['batch_size']}, "
          f"{c['workers']} workers, {c['epochs']} epochs a run\n")
    print("| images | way | images/s (best) | of ceiling (median per round) | start s | memory growth, PSS MiB "
          "| RssAnon MiB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for s in report["sizes"]:
        for name, w in s["ways"].items():
            print(f"| {s['images']:,} | {name} | {w['images_per_s']:,.0f} | {w['vs_ceiling_median_round']:.0%} "
                  f"| {w['start_s']:.2f} | {w['pss_growth_mib']:.0f} | {w['anon_growth_mib']:.0f} |")
        print("| | ratios | " + ", ".join(f"{k} {v:.2f}" for k, v in s["ratios"].items()) + " | | | | |")
    t = report["text"]
    print(f"\ntext: {t['texts']:,} strings, ~{t['tokens_per_text']:.0f} tokens each")
    for name, w in t["ways"].items():
        print(f"  {name}: {w['tokens_per_s']:,.0f} tokens/s ({w['vs_plain_loop_median_round']:.2f}x the plain loop)")


if __name__ == "__main__":
    main()
