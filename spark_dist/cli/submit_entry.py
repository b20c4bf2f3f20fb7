"""The file ``spark-submit`` runs (``spark-dist submit-path`` prints its path).

    spark-submit [spark options] $(spark-dist submit-path) [spark-dist run options] train.py [args...]

spark-submit owns what the JVM needs at start (``--master``, ``--properties-file``, driver memory and
options, before the path); this file takes the options of ``spark-dist run`` except ``--master``, joins
the SparkSession of spark-submit's JVM (adding only the settings given after the path), and exits with
the codes of :mod:`spark_dist.cli.commands`, which spark-submit passes on as its own.
"""
import os
import sys

# Run by path, this file's folder (spark_dist/) comes first on sys.path, where its modules (config,
# errors, data, ...) would shadow top-level modules of the same names for everything imported later,
# the ranks' processes included. Import spark_dist as the installed package instead.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import argparse  # noqa: E402

from spark_dist.cli import commands as cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-submit [spark options] $(spark-dist submit-path)",
        description="Run a torchrun-style script on the cluster spark-submit connects to. Settings the JVM "
                    "needs at start (--master, --properties-file, driver memory and options) go to "
                    "spark-submit, before the submit path; --conf after it applies to the session.",
        epilog=cli._EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_options(parser, with_master=False)
    # Taken only to say where it belongs: after the submit path it would silently fight spark-submit's.
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.set_defaults(under_spark_submit=True)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.master is not None:
        parser.error("--master is spark-submit's option here: put it before the submit path")
    return cli.execute(args)


if __name__ == "__main__":
    sys.exit(main())
