"""Side-by-side tables of the two Spark lines from ``bench/results/*-spark<line>.json`` (what `make bench`
writes), in Markdown, for BENCHMARKS.md. ``python bench/report.py`` (no Spark, no torch needed)."""
import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
LINES = ("3.5", "4")


def load(name):
    found = {}
    for line in LINES:
        path = os.path.join(RESULTS, f"{name}-spark{line}.json")
        if os.path.exists(path):
            with open(path) as f:
                found[line] = json.load(f)
    return found


def table(title, rows, figures):
    """``rows``: (label, function of one line's JSON -> text)."""
    lines = [f"### {title}", "", "| | " + " | ".join(f"Spark {line}" for line in figures) + " |",
             "|---|" + "---:|" * len(figures)]
    for label, pick in rows:
        cells = []
        for data in figures.values():
            try:
                cells.append(pick(data))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seconds(value):
    return f"{value:.2f} s"


def launch_rows(bare_label, bare_key, first_label):
    """The rows of a launch table (bench_launch.py and bench_connect.py write the same figures)."""
    def f(d, key, figure):
        return seconds(d["figures"][key][figure])

    return [
        (f"{bare_label}, warm median", lambda d: f(d, bare_key, "warm_median")),
        (f"**spark_dist**, {first_label}", lambda d: f(d, "spark_dist Distributor", "first")),
        ("**spark_dist**, warm median of 5", lambda d: f(d, "spark_dist Distributor", "warm_median")),
        ("PySpark TorchDistributor, first run", lambda d: f(d, "PySpark TorchDistributor", "first")),
        ("PySpark TorchDistributor, warm median", lambda d: f(d, "PySpark TorchDistributor", "warm_median")),
        ("**TorchDistributor / spark_dist, warm**", lambda d: f"**{d['ratios']['warm_median']:.1f}x**"),
    ]


def data_rows():
    """The rows of a data table: one dataset's figures as bench_data.py writes them."""
    def found(d, prefix):
        (name,) = [n for n in d["readers"] if n.startswith(prefix)]
        return d["readers"][name]

    def reader(prefix, key):
        def pick(d):
            value = found(d, prefix)[key]
            return f"{value:,.0f}" if key == "rows_per_s" else (
                f"{value:.1f}x" if key == "vs_petastorm" else f"{value:.0%}")
        return pick

    def median_round(prefix):
        def pick(d):
            r = found(d, prefix)
            interval = r.get("vs_ceiling_median_round_interval")
            return f"{r['vs_ceiling_median_round']:.0%}" + ("" if not interval else
                                                            "; {:.0%}-{:.0%}".format(*interval))
        return pick

    return [
        ("dataset cache write (`prepare_datasets`)", lambda d: seconds(d["prepare_seconds"])),
        ("Petastorm make_torch_dataloader, rows/s", reader("(a)", "rows_per_s")),
        ("pyarrow iter_batches -> torch (ceiling), rows/s", reader("(b)", "rows_per_s")),
        ("**spark_dist ctx.loader (shuffled)**, rows/s", reader("(c)", "rows_per_s")),
        ("**spark_dist shuffled, x Petastorm**", reader("(c)", "vs_petastorm")),
        ("spark_dist shuffled, of ceiling (best of each)", reader("(c)", "vs_ceiling")),
        ("**spark_dist shuffled, of ceiling (median per round; 95% interval)**", median_round("(c)")),
        ("spark_dist unshuffled, of ceiling", reader("(c')", "vs_ceiling")),
    ]


def main():
    out = []
    launch = load("launch")
    if launch:
        out.append(table("Launch: 2 ranks, one gloo all-reduce (standalone cluster, warm session)",
                         launch_rows("bare barrier stage", "bare barrier stage (no sync)", "first run"), launch))
    connect = {line: d for line, d in load("connect").items() if "skipped" not in d}
    if connect:
        out.append(table("Launch through Spark Connect: 2 ranks, one gloo all-reduce (a Connect server in front of "
                         "the standalone cluster; the 3.5 line has no Connect server)",
                         launch_rows("bare barrier mapInArrow stage", "bare barrier mapInArrow stage",
                                     "first run in a new client session"), connect))
    horovod = load("horovod")
    if horovod:
        out.append(table("Horovod: 2 ranks, hvd.init() and one all-reduce", [
            ("**spark_dist backend='horovod'**, first / warm median",
             lambda d: f"{d['spark_dist_horovod']['first_s']:.2f} / {d['spark_dist_horovod']['warm_median_s']:.2f} s"),
            ("horovod.spark.run, first / warm median",
             lambda d: f"{d['horovod_spark_run']['first_s']:.2f} / {d['horovod_spark_run']['warm_median_s']:.2f} s"),
            ("**horovod.spark.run / spark_dist, warm**", lambda d: f"**{d['ratio_warm']:.1f}x**"),
            ("100 MB all-reduce, Horovod (gloo)", lambda d: f"{d['allreduce_horovod']['mb_per_s']:,.0f} MB/s"),
            ("100 MB all-reduce, DDP (gloo)", lambda d: f"{d['allreduce_ddp_gloo']['mb_per_s']:,.0f} MB/s"),
        ], horovod))
    data = load("data")
    for dataset, columns in (("issue", "32 floats + label: goal 1's dataset"),
                             ("wide", "32 floats + label + 64-float vector")):
        figures = {line: d["datasets"][dataset] for line, d in data.items() if dataset in d.get("datasets", {})}
        if figures:
            out.append(table(f"Data: 500,000 rows ({columns}), one rank, batches of 1,024",
                             data_rows(), figures))
    ml = load("ml")
    if ml:
        out.append(table("Spark ML: digits Pipeline (VectorAssembler + TorchEstimator, 2 ranks DDP), local[2]", [
            ("**first fit of a session** (median of 5 fresh sessions)",
             lambda d: f"**{d['fit']['first_fit_median']:.2f} s**"),
            ("first fits", lambda d: ", ".join(f"{x:.2f}" for x in [d["fit"]["first_fit_seconds"]]
                                               + d["fit"]["fresh_session_first_fits"])),
            ("first fit with the JVM class archive (median of fresh sessions)",
             lambda d: seconds(d["fit"]["archive_first_fit_median"]) if "archive_first_fit_median" in d["fit"]
             else "-"),
            ("later fits (median)", lambda d: seconds(d["fit"]["pipeline_median"])),
            ("estimator again on a cached DataFrame (median)", lambda d: seconds(d["fit"]["cache_reused_median"])),
            ("held-out accuracy", lambda d: f"{min(d['fit']['held_out_accuracy']):.3f}-"
                                            f"{max(d['fit']['held_out_accuracy']):.3f}"),
            ("TorchModel.transform, rows/s",
             lambda d: f"{d['transform']['methods']['spark_dist TorchModel.transform (pandas_udf)']['rows_per_s']:,.0f}"),
            ("**transform vs row by row**", lambda d: f"**{d['transform']['speedup']:.1f}x**"),
            ("a fresh `import torch` that day (machine speed)",
             lambda d: seconds(d["fit"]["import_torch_seconds"]) if "import_torch_seconds" in d["fit"] else "-"),
        ], ml))
    history = load("history")
    if history:
        out.append(table("The session's first fit against the code when #17 was filed (fresh processes taking "
                         "turns, the same hour)", [
            ("that code (median)", lambda d: f"{seconds(d['then_median'])} ({d['against']})"),
            ("this code, a plain session (median)", lambda d: seconds(d["now_median"])),
            ("**this code / that code** (goal: 6 s of 8.35 s = 0.72x; of eee1b36's own 6.91-7.13 s, 0.84-0.87x)",
             lambda d: f"**{d['ratio_of_medians']:.2f}x**"),
            ("this code with spark_dist_daemon and the JVM class archive, as `spark-dist run` (median); / that code",
             lambda d: f"{seconds(d['now_options_median'])}; {d['now_options_ratio_of_medians']:.2f}x"
             if "now_options_median" in d else "-"),
            ("later fits, that code / this code (medians)",
             lambda d: f"{seconds(d['then_later_median'])} / {seconds(d['now_later_median'])}"
             if "now_later_median" in d else "-"),
            ("**later fits, this code / that code** (goal: 3 s of eee1b36's own 2.98-3.21 s, 0.93-1.0x)",
             lambda d: f"**{d['later_ratio_of_medians']:.2f}x**" if "later_ratio_of_medians" in d else "-"),
            ("a fresh `import torch` that hour", lambda d: seconds(d["import_torch_seconds"])),
        ], history))
    recovery = load("recovery")
    if recovery:
        out.append(table("Failure detection and recovery (standalone, 2 ranks)", [
            (key, (lambda k: lambda d: seconds(d[k]))(key)) for key in next(iter(recovery.values()))
        ], recovery))
    print("\n".join(out))


if __name__ == "__main__":
    main()
