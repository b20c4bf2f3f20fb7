"""Rows per second of ``spark_dist.predict_batch_udf`` against PySpark's ``pyspark.ml.functions.predict_batch_udf``
on the same DataFrame with the same ``make_predict_fn`` (a script, not a test).

    python bench/bench_inference.py [--rows 1000000] [--images 20000] [--texts 20000] [--rounds 3] [--out FILE]

On ``local[2]``, each DataFrame cached in memory first (so both UDFs read the same rows from memory), each run
``df.select(udf(...)).write.format("noop")`` (every row predicted, nothing collected); the two UDFs take turns
in ``--rounds`` rounds, rows/s is the median. Workloads (issue #42, item 5):

  mlp          ``--rows`` rows x 32 floats (``array<float>``), an MLP 32-64-64-1 -> ``float``; batches of 1,024
  cnn          ``--images`` 64x64 JPEGs (``binary``) decoded with PIL inside the predict function, a small CNN
               -> the class (``long``); batches of 128
  transformer  ``--texts`` made-up sentences (``string``) tokenized inside the predict function (a WordPiece
               tokenizer trained on the fly), a 2-layer BERT encoder built from a config (hidden 64) -> its mean
               embedding (``array<float>``); batches of 64

The ceiling, a third way in every round: the same predict function over the same batches with no Spark, in
``multiprocessing.Pool(2)`` (one process per task slot of ``local[2]``, one torch thread each): each worker makes
the predict function once and runs it on one batch before the rounds (as each UDF's workers load the model
before them); a round maps it over the inputs held in the driver, cut as the DataFrame's 8 partitions and each
partition into batches of the UDFs' batch size, the batches sent to the workers and the predictions sent back.
Of the ceiling: spark_dist's rows/s over the pool's (median over median; each round's too).

The predict function alone: the same function over the same inputs in memory, in one process, in a plain loop
(its rows/s, best of 2, before the rounds); the forward share is ``rows / (2 x its rows/s) / wall seconds``, the
part of the 2 cores' time that the predict function itself would need. Nothing is downloaded: models from
configs, tokenizer trained here.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

torch_threads = 1  # each of local[2]'s tasks has one core; the ceiling's workers and the function alone too


# -- the workloads: (make_predict_fn, return type, batch size, input shapes) ---------------------------------
def mlp_predict_fn():
    import torch

    torch.set_num_threads(torch_threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).eval()

    def predict(x):
        with torch.inference_mode():
            return model(torch.as_tensor(x, dtype=torch.float32)).numpy()[:, 0]
    return predict


def cnn_predict_fn():
    import io

    import numpy as np
    import torch
    from PIL import Image
    from torch import nn

    torch.set_num_threads(torch_threads)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 16 * 16, 10)).eval()

    def predict(images):
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in images])
        x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255.0)
        with torch.inference_mode():
            return model(x).argmax(1).numpy()
    return predict


def transformer_predict_fn(tokenizer_json: str):
    def make():
        import torch
        from tokenizers import Tokenizer
        from transformers import BertConfig, BertModel

        torch.set_num_threads(torch_threads)
        torch.manual_seed(0)
        tokenizer = Tokenizer.from_str(tokenizer_json)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        tokenizer.enable_truncation(max_length=128)
        model = BertModel(BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128, max_position_embeddings=128))
        model.eval()

        def predict(texts):
            encoded = tokenizer.encode_batch(list(texts))
            ids = torch.tensor([e.ids for e in encoded])
            mask = torch.tensor([e.attention_mask for e in encoded])
            with torch.inference_mode():
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            return mean.numpy()
        return predict
    return make


def train_tokenizer(texts: list) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=4000,
                                                                   special_tokens=["[PAD]", "[UNK]"]))
    return tokenizer.to_str()


# -- measuring --------------------------------------------------------------------------------------------------
def alone(make_predict_fn, inputs, batch_size: int, rounds: int = 2) -> float:
    """Rows/s of the predict function alone over ``inputs`` (a numpy array) held in memory, in this process."""
    predict = make_predict_fn()
    batches = [inputs[i:i + batch_size] for i in range(0, len(inputs), batch_size)]
    predict(batches[0])
    best = None
    for _ in range(rounds):
        started = time.perf_counter()
        for batch in batches:
            predict(batch)
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    return len(inputs) / best


PARTITIONS = 8  # each workload's DataFrame: repartitioned (or made) in this many partitions
_pool_predict = None  # a ceiling worker's predict function (made by _pool_start)


def _pool_start(make_predict_fn, first_batch, ready):
    global _pool_predict
    _pool_predict = make_predict_fn()
    _pool_predict(first_batch)
    ready.wait()


def _pool_batch(batch) -> int:
    return len(_pool_predict(batch))


def partition_batches(inputs, batch_size: int) -> list:
    """``inputs`` cut as the DataFrame's :data:`PARTITIONS` partitions of about equal size, each into batches of
    ``batch_size`` (its last one shorter), as the UDFs' Python workers get them."""
    import numpy as np

    return [part[i:i + batch_size] for part in np.array_split(inputs, PARTITIONS)
            for i in range(0, len(part), batch_size)]


class Ceiling:
    """The ceiling's pool (module docstring): ``Ceiling(make_predict_fn, inputs, batch_size)`` as a context
    manager, each call one round, its seconds."""

    def __init__(self, make_predict_fn, inputs, batch_size: int, workers: int = 2):
        import multiprocessing

        self.batches = partition_batches(inputs, batch_size)
        self.rows = sum(len(b) for b in self.batches)
        context = multiprocessing.get_context("fork")
        ready = context.Barrier(workers + 1)  # every worker's function made and run once before the rounds
        self.pool = context.Pool(workers, initializer=_pool_start, initargs=(make_predict_fn, self.batches[0], ready))
        ready.wait(timeout=600)

    def __call__(self) -> float:
        started = time.perf_counter()
        done = sum(self.pool.imap(_pool_batch, self.batches))
        seconds = time.perf_counter() - started
        assert done == self.rows, (done, self.rows)
        return seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pool.close()
        self.pool.join()


def timed_select(df, udf, column) -> float:
    started = time.perf_counter()
    df.select(udf(column).alias("p")).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def side_by_side(name, df, column, rows, make_predict_fn, return_type, batch_size, shapes, rounds,
                 alone_rows_s, inputs) -> dict:
    """The two UDFs and the ceiling's pool over ``inputs`` (the DataFrame's rows, in memory), taking turns."""
    from pyspark.ml.functions import predict_batch_udf as pyspark_udf

    from spark_dist import predict_batch_udf

    ways = {"pyspark": pyspark_udf, "spark_dist": predict_batch_udf}
    udfs = {way: make(make_predict_fn, return_type=return_type, batch_size=batch_size, input_tensor_shapes=shapes)
            for way, make in ways.items()}
    for udf in udfs.values():  # each way's Python workers load its model once before the timed rounds
        timed_select(df.limit(batch_size * 4), udf, column)
    runs = {way: (lambda udf=udf: timed_select(df, udf, column)) for way, udf in udfs.items()}
    seconds = {way: [] for way in [*ways, "ceiling"]}
    with Ceiling(make_predict_fn, inputs, batch_size) as ceiling_round:
        assert ceiling_round.rows == rows, (ceiling_round.rows, rows)
        runs["ceiling"] = ceiling_round
        for _ in range(rounds):
            for way, run in runs.items():
                seconds[way].append(run())
    out = {"rows": rows, "batch_size": batch_size, "alone_rows_per_s": alone_rows_s, "ways": {}}
    for way, times in seconds.items():
        median = statistics.median(times)
        out["ways"][way] = {"seconds": times, "rows_per_s": rows / median,
                            "forward_share": rows / (2 * alone_rows_s) / median}
    out["ratio"] = out["ways"]["spark_dist"]["rows_per_s"] / out["ways"]["pyspark"]["rows_per_s"]
    out["round_ratios"] = [p / s for p, s in zip(seconds["pyspark"], seconds["spark_dist"])]
    for way in ways:
        out[f"{way}_of_ceiling"] = out["ways"][way]["rows_per_s"] / out["ways"]["ceiling"]["rows_per_s"]
        out[f"{way}_of_ceiling_rounds"] = [c / s for c, s in zip(seconds["ceiling"], seconds[way])]
    print(f"{name}: pyspark {out['ways']['pyspark']['rows_per_s']:,.0f} rows/s, spark_dist "
          f"{out['ways']['spark_dist']['rows_per_s']:,.0f} rows/s: {out['ratio']:.2f}x (rounds "
          f"{', '.join(f'{r:.2f}' for r in out['round_ratios'])}); the ceiling's pool "
          f"{out['ways']['ceiling']['rows_per_s']:,.0f} rows/s, spark_dist {out['spark_dist_of_ceiling']:.0%} of it "
          f"(rounds {', '.join(f'{r:.0%}' for r in out['spark_dist_of_ceiling_rounds'])}), pyspark "
          f"{out['pyspark_of_ceiling']:.0%}; the function alone {alone_rows_s:,.0f} rows/s a core; forward share "
          f"{out['ways']['spark_dist']['forward_share']:.0%} (pyspark {out['ways']['pyspark']['forward_share']:.0%})",
          flush=True)
    return out


def cached(df):
    df = df.cache()
    df.count()
    return df


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn", "transformer"])
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this line's environment
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import pyspark
    import torch
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, LongType

    torch.set_num_threads(torch_threads)
    line = pyspark.__version__.split(".")[0]
    line = line if int(line) >= 4 else ".".join(pyspark.__version__.split(".")[:2])
    spark = (SparkSession.builder.master("local[2]").appName("bench_inference")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    t_start, load_before = time.perf_counter(), os.getloadavg()[0]
    workloads = {}
    try:
        if "mlp" in args.workloads:
            df = cached(spark.range(args.rows, numPartitions=PARTITIONS).select(
                F.array(*[F.sin(F.col("id") * (k + 1)).cast("float") for k in range(32)]).alias("x")))
            x_all = np.sin(np.arange(args.rows)[:, None] * np.arange(1, 33)).astype(np.float32)  # the same rows
            x = x_all[:200_000]
            workloads["mlp"] = side_by_side("mlp", df, "x", args.rows, mlp_predict_fn, FloatType(), 1024, [[32]],
                                            args.rounds, alone(mlp_predict_fn, x, 1024), x_all)
            df.unpersist()
        if "cnn" in args.workloads:
            from bench_transform import make_jpegs

            jpegs = make_jpegs(args.images, 64)
            df = cached(spark.createDataFrame([(b,) for b in jpegs], "image binary").repartition(PARTITIONS))
            images = np.array(jpegs, dtype=object)
            workloads["cnn"] = side_by_side("cnn", df, "image", args.images, cnn_predict_fn, LongType(), 128, None,
                                            args.rounds, alone(cnn_predict_fn, images, 128), images)
            df.unpersist()
        if "transformer" in args.workloads:
            from bench_images import make_texts

            texts = make_texts(args.texts)
            make = transformer_predict_fn(train_tokenizer(texts))
            df = cached(spark.createDataFrame([(t,) for t in texts], "text string").repartition(PARTITIONS))
            strings = np.array(texts, dtype=object)
            workloads["transformer"] = side_by_side(
                "transformer", df, "text", args.texts, make, ArrayType(FloatType()), 64, None, args.rounds,
                alone(make, strings, 64), strings)
            df.unpersist()
    finally:
        spark.stop()
    report = {"date": time.strftime("%Y-%m-%d"), "spark": pyspark.__version__, "line": line,
              "config": {"rows": args.rows, "images": args.images, "texts": args.texts, "rounds": args.rounds},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
              "workloads": workloads, "seconds": time.perf_counter() - t_start,
              "load_average": [load_before, os.getloadavg()[0]]}  # other work on the machine skews the rates
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
