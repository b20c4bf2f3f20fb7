"""The file ``spark-submit`` runs (``spark-dist submit-path`` prints its path).

    spark-submit [spark options] $(spark-dist submit-path) [spark-dist run options] train.py [args...]

spark-submit owns the cluster settings (``--master``, ``--properties-file``, ``--conf`` before the path);
this file takes the options of ``spark-dist run`` except ``--master``, joins the SparkSession that
spark-submit's JVM provides, and exits with the codes of :mod:`spark_dist.cli`.
"""
import os
import sys

# Run by path, this file's folder (spark_dist/) comes first on sys.path, where its modules (config,
# errors, data, ...) would shadow top-level modules of the same names for everything imported later,
# the ranks' processes included. Import spark_dist as the installed package instead.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import argparse  # noqa: E402

from spark_dist import cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-submit [spark options] $(spark-dist submit-path)",
        description="Run a torchrun-style script on the cluster spark-submit connects to. Cluster settings "
                    "(--master, --properties-file, --conf) go to spark-submit, before the submit path.",
        epilog=cli._EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_options(parser, with_master=False)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cli.execute(args)


if __name__ == "__main__":
    sys.exit(main())
