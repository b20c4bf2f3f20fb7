"""The ``spark-dist`` command: run a torchrun-style script on a Spark cluster.

    spark-dist run [--master URL] [--num-processes N] [options] train.py [script args...]
    spark-submit [spark options] $(spark-dist submit-path) [run options] train.py [script args...]
    spark-dist submit-path
    spark-dist conf-path

Exit codes: 0 success; 1 a rank failed (its headline and traceback on stderr); 2 a usage or
configuration error (bad flag, missing script, a :class:`~spark_dist.errors.ConfigError`, a SparkSession
that could not start), always before any Spark job; 124 the run exceeded ``--timeout``; 130 interrupted.

The session ``spark-dist run`` creates is its own: on a local master it names :mod:`spark_dist_daemon` as its
Python daemon (docs/speedups.md); it passes no JVM options of its own.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence

from ..config import BACKENDS
from ..errors import ConfigError, RunTimeoutError, TrainingFailedError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130

_DESCRIPTION = "Distributed PyTorch training on Apache Spark: run a torchrun-style script on N ranks."
_EPILOG = """\
exit codes:
  0    the run succeeded
  1    a rank failed; stderr names the first failed rank and host, with that rank's traceback
  2    usage or configuration error (bad flag, missing script, a wrong setting, Spark could not
       start), before any job
  124  the run exceeded --timeout
  130  interrupted (Ctrl-C)

environment:
  PYSPARK_PYTHON  the Python that executors run (needs spark_dist and torch); for a local master,
                  default: this interpreter
  SPARK_LOCAL_IP  the address Spark binds; 'spark-dist run' also advertises it as the driver's
                  host (spark.driver.host) unless --conf sets one

examples:
  spark-dist run --master local[2] --num-processes 2 train.py --epochs 3
  spark-dist run --master spark://host:7077 --num-processes 4 --conf spark.executor.memory=4g train.py
  spark-dist run --local-mode --num-processes 2 train.py        # processes on this machine, no Spark
  spark-submit --master yarn --properties-file conf/spark-defaults.gpu-yarn.conf \\
      $(spark-dist submit-path) --num-processes 8 --use-gpu train.py --epochs 3
"""


def _conf_pair(text: str):
    """argparse type for ``--conf key=value``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_run_options(parser: argparse.ArgumentParser, *, with_master: bool = True) -> None:
    """The options of ``spark-dist run``; the spark-submit entry shares them (minus ``--master``, which
    belongs to spark-submit there)."""
    if with_master:
        parser.add_argument("--master", metavar="URL",
                            help="Spark master (local[N], spark://host:port, yarn, k8s://...); default: "
                                 "spark.master from --conf/--properties-file, else Spark's default (local[*])")
    parser.add_argument("--num-processes", "-n", type=int, default=1, metavar="N",
                        help="number of ranks (with --use-gpu: one GPU each); default 1")
    parser.add_argument("--backend", choices=BACKENDS, default="ddp",
                        help="ddp: the script calls init_process_group() as under torchrun; "
                             "horovod: the script calls hvd.init(). Default ddp")
    parser.add_argument("--local-mode", action="store_true",
                        help="run the ranks as processes on this machine instead of Spark tasks; no Spark "
                             "session is started unless --master, --conf or --properties-file is given")
    parser.add_argument("--use-gpu", action="store_true",
                        help="one GPU per rank (needs spark.task.resource.gpu.amount, see conf/)")
    parser.add_argument("--layout", choices=("host", "task"), default="host",
                        help="what a torchrun node is: host (LOCAL_RANK numbers a machine's ranks, the "
                             "default) or task (each Spark task a node, as PySpark's TorchDistributor)")
    parser.add_argument("--max-retries", type=int, default=0, metavar="K",
                        help="resubmit a failed run up to K times; the script resumes from its snapshot")
    parser.add_argument("--min-processes", type=int, default=None, metavar="M",
                        help="elastic: go on with as few as M ranks when executors are lost, growing back to "
                             "--num-processes at a checkpoint once their slots return (spark.dist.minProcesses)")
    parser.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                        help="stop the run (all attempts) after this many seconds; exit code 124")
    parser.add_argument("--conf", "-c", type=_conf_pair, action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark conf entry (repeatable); wins over --properties-file")
    parser.add_argument("--properties-file", metavar="FILE",
                        help="Spark properties ('key value' lines, like spark-defaults.conf; see conf/)")
    parser.add_argument("--name", metavar="APP_NAME", help="Spark application name; default 'spark-dist: SCRIPT'")
    parser.add_argument("--run-id", metavar="ID", help="name of the run; reuse an earlier run's id to resume it")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where get_context().save_checkpoint writes (conf spark.dist.checkpointDir); "
                             "must be visible to every executor")
    parser.add_argument("--quiet", "-q", action="store_true", help="do not print reports and the run summary")
    parser.add_argument("script", help="the training script (.py), run on every rank as torchrun would")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="arguments for the script (everything after the script path)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-dist", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser("run", help="run a script on the cluster", description=_DESCRIPTION,
                              epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(run)
    run.set_defaults(under_spark_submit=False)
    commands.add_parser("submit-path", help="print the file to give spark-submit",
                        description="Print the path of the Python file that spark-submit runs: "
                                    "spark-submit [spark options] $(spark-dist submit-path) [run options] "
                                    "script.py [args]. It takes the options of 'spark-dist run' except --master.")
    commands.add_parser("conf-path", help="print the directory of the cluster templates",
                        description="Print the directory holding the spark-defaults templates (local, GPU on "
                                    "standalone, YARN, Kubernetes), the GPU discovery script and log4j2 file: "
                                    "spark-submit --properties-file $(spark-dist conf-path)/spark-defaults.local.conf")
    return parser


def conf_path() -> str:
    """The directory of the ``conf/`` templates: the checkout's (a development install), else the copy an
    installed wheel put under ``share/spark_dist/conf`` of its scheme (the environment's or ``--user``'s).

    Raises:
        ConfigError: neither is there (the message lists where it looked).
    """
    import site
    import sysconfig

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # spark_dist/, above cli/
    checkout = os.path.join(os.path.dirname(package), "conf")
    candidates = [checkout] + [os.path.join(base, "share", "spark_dist", "conf")
                               for base in (sys.prefix, sysconfig.get_path("data"), site.USER_BASE) if base]
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "spark-defaults.local.conf")):
            return candidate
    raise ConfigError(f"the spark_dist conf templates are not installed; looked in {', '.join(candidates)}")


def submit_path() -> str:
    """The file spark-submit runs (``spark_dist/submit_entry.py``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "submit_entry.py")


def read_properties(path: str) -> Dict[str, str]:
    """Parse a spark-defaults.conf style file: ``key value`` (or ``key=value``) lines, ``#`` comments.

    Raises:
        ConfigError: the file is missing or a line has no value, naming the file and line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"--properties-file {path!r} cannot be read: {exc.strerror}") from None
    props: Dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        # Spark (java.util.Properties) splits at the first whitespace, '=' or ':'.
        cut = min((i for i in (line.find(c) for c in " \t=:") if i > 0), default=-1)
        if cut < 0:
            raise ConfigError(f"{path}:{number}: expected 'key value', got {line!r}")
        key, value = line[:cut], line[cut:].lstrip(" \t").lstrip("=:").strip()
        props[key] = value
    return props


def session_conf(args: argparse.Namespace) -> Dict[str, str]:
    """The Spark conf for the session: properties file, then --conf, then --master (later wins); on a local
    master, PySpark's daemon as :mod:`spark_dist_daemon` (unless ``spark.python.daemon.module`` is given). Java
    options are only yours (docs/speedups.md has a class archive recipe for them).

    Under spark-submit, only these explicit entries: defaults here would override spark-submit's own conf (and
    its JVM runs already).

    Raises:
        ConfigError: the properties file cannot be read or parsed.
    """
    conf: Dict[str, str] = {}
    if args.properties_file:
        conf.update(read_properties(args.properties_file))
    conf.update(dict(args.conf))
    if getattr(args, "master", None):
        conf["spark.master"] = args.master
    if args.under_spark_submit:
        return conf
    # Bind where the user asked the machine to bind (SPARK_LOCAL_IP); never assume loopback ourselves.
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if local_ip and "spark.driver.host" not in conf:
        conf["spark.driver.host"] = local_ip
    # One barrier stage runs the whole training: its progress bar would only garble the ranks' output.
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    # This session is this command's own, so it may choose its daemon: on a local master, one importing the
    # installed PySpark instead of Spark's zip (spark_dist_daemon), only where the workers run this environment,
    # which finds the module (python_daemon.conf_default). A user's own session gets it only by naming it.
    from ..spark import python_daemon

    daemon = python_daemon.conf_default(conf, _local_workers_python(conf))
    if daemon:
        conf[python_daemon.KEY] = daemon
    return conf


def _local_workers_python(conf: Dict[str, str]) -> str:
    """The Python a local master's workers run: ``PYSPARK_PYTHON``, else ``spark.pyspark.python``, else this
    interpreter (with spark_dist and torch), where PySpark's default is whatever "python3" is first on PATH."""
    return os.environ.get("PYSPARK_PYTHON") or conf.get("spark.pyspark.python", sys.executable)


def needs_session(args: argparse.Namespace) -> bool:
    """Spark tasks need a session; local mode only when the user asked for Spark settings."""
    return not args.local_mode or bool(getattr(args, "master", None) or args.conf or args.properties_file)


def get_session(args: argparse.Namespace):
    """Create the SparkSession, or join the one spark-submit's JVM is about to create (same call)."""
    from pyspark.sql import SparkSession

    conf = session_conf(args)
    # A local master's Python workers run on this machine (_local_workers_python). PySpark reads only the
    # environment variable here (spark.pyspark.python is spark-submit's).
    if conf.get("spark.master", "").startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = _local_workers_python(conf)
    builder = SparkSession.builder.appName(args.name or f"spark-dist: {os.path.basename(args.script)}")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def make_distributor(args: argparse.Namespace, spark=None):
    """The :class:`~spark_dist.driver.distributor.Distributor` the options describe.

    Raises:
        ConfigError: a bad option value (for example ``--num-processes 0``), naming it.
    """
    from ..driver.distributor import Distributor

    return Distributor(
        num_processes=args.num_processes, backend=args.backend, local_mode=args.local_mode,
        use_gpu=args.use_gpu, max_retries=args.max_retries, timeout=args.timeout,
        checkpoint_dir=args.checkpoint_dir, run_id=args.run_id, verbose=not args.quiet, layout=args.layout,
        min_processes=args.min_processes, spark=spark)


def execute(args: argparse.Namespace, stderr=None) -> int:
    """Run the script as ``args`` say; return the exit code (never raises for a failed run)."""
    stderr = stderr or sys.stderr
    if not os.path.isfile(args.script):
        print(f"spark-dist: error: script {args.script!r} not found (give the path of a .py file)", file=stderr)
        return EXIT_USAGE
    spark = None
    try:
        make_distributor(args)  # checks the arguments in a second, before a JVM starts
        if needs_session(args):
            try:
                spark = get_session(args)
            except ConfigError:
                raise
            except Exception as exc:  # a bad master URL, no Java: spark-submit has printed why above
                print(f"spark-dist: could not start a SparkSession: {exc}", file=stderr)
                return EXIT_USAGE
        make_distributor(args, spark).run(os.path.abspath(args.script), *args.script_args)
        return EXIT_OK
    except ConfigError as exc:
        print(f"spark-dist: configuration error: {exc}", file=stderr)
        return EXIT_USAGE
    except RunTimeoutError as exc:
        print(f"spark-dist: run timed out: {exc}", file=stderr)
        return EXIT_TIMEOUT
    except TrainingFailedError as exc:
        print(f"spark-dist: training failed: {exc}", file=stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("spark-dist: interrupted", file=stderr)
        return EXIT_INTERRUPTED
    finally:
        if spark is not None:
            spark.stop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``spark-dist`` and ``python -m spark_dist``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "submit-path":
        print(submit_path())
        return EXIT_OK
    if args.command == "conf-path":
        try:
            print(conf_path())
        except ConfigError as exc:
            print(f"spark-dist: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    return execute(args)


if __name__ == "__main__":
    sys.exit(main())
