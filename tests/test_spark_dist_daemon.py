"""spark_dist_daemon: PySpark's daemon, importing the installed PySpark instead of Spark's zip of it.

A session started with ``spark.python.daemon.module=spark_dist_daemon`` runs in a subprocess (the conf takes effect
only in a SparkContext started with it, and this test process already holds one). The choice of what to drop is
shown on folders laid out like a pip-installed PySpark and like a Spark distribution.
"""
import json
import os
import sys
import textwrap
import zipfile

import spark_dist_daemon
from spark_dist_daemon import zips_of_installed_packages
from test_cli import run_command


def _package(root, name, files=()):
    os.makedirs(root / name, exist_ok=True)
    (root / name / "__init__.py").write_text("")
    for file, text in files:
        (root / name / file).write_text(text)
    return root / name


def _zip(path):
    os.makedirs(path.parent, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(path.name.split("-")[0].replace(".zip", "") + "/__init__.py", "")
    return str(path)


def _pip_layout(site, py4j_installed="0.10.9.9", py4j_zipped="0.10.9.9"):
    """site-packages with pyspark (holding python/lib/<zips>, as pip installs it) and py4j; the zips' paths."""
    pyspark = _package(site, "pyspark")
    _package(site, "py4j", [("version.py", f"__version__ = '{py4j_installed}'\n")])
    lib = pyspark / "python" / "lib"
    return _zip(lib / "pyspark.zip"), _zip(lib / f"py4j-{py4j_zipped}-src.zip")


def test_the_zips_of_a_pip_installed_pyspark_are_dropped(tmp_path):
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _pip_layout(site)
    work, stdlib = str(tmp_path / "work"), str(tmp_path / "stdlib")
    path = [work, pyspark_zip, py4j_zip, stdlib, str(site)]  # as a daemon's sys.path orders them
    assert zips_of_installed_packages(path) == [pyspark_zip, py4j_zip]
    # Through a symlink to the same site-packages (a linked environment), the zips are still the package's own.
    os.symlink(site, tmp_path / "linked")
    assert zips_of_installed_packages([pyspark_zip, py4j_zip, str(tmp_path / "linked")]) == [pyspark_zip, py4j_zip]


def test_a_pyspark_that_would_shadow_the_installed_one_keeps_the_zips(tmp_path):
    """A folder named pyspark earlier on the path (the working directory of a project) is what an import would
    find without the zips, not the installed package: keep them."""
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _pip_layout(site)
    work = tmp_path / "work"
    _package(work, "pyspark")
    assert zips_of_installed_packages([str(work), pyspark_zip, py4j_zip, str(site)]) == []


def test_py4j_stays_zipped_where_the_installed_py4j_is_another_version(tmp_path):
    """PySpark 3.5.x ships py4j 0.10.9.7 in its zip, and its pip dependency allows a newer py4j."""
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _pip_layout(site, py4j_installed="0.10.9.9", py4j_zipped="0.10.9.7")
    assert zips_of_installed_packages([pyspark_zip, py4j_zip, str(site)]) == [pyspark_zip]


def test_a_spark_distributions_zips_are_kept(tmp_path):
    """SPARK_HOME=/opt/spark: its PySpark may be another version than a pip-installed one in site-packages."""
    site = tmp_path / "site-packages"
    _pip_layout(site)
    lib = tmp_path / "opt" / "spark" / "python" / "lib"
    path = [_zip(lib / "pyspark.zip"), _zip(lib / "py4j-0.10.9.9-src.zip"), str(site)]
    assert zips_of_installed_packages(path) == []
    # ... and where no PySpark is installed at all, the zips are all there is.
    assert zips_of_installed_packages(path[:2] + [str(tmp_path / "empty")]) == []
    assert zips_of_installed_packages([str(site)]) == []


SESSION = textwrap.dedent("""
    import json, os, sys
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from spark_dist import Distributor

    spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.daemon.module", "spark_dist_daemon").getOrCreate())

    def origins(_):
        import py4j, pyspark
        yield {"pyspark": pyspark.__file__, "py4j": py4j.__file__, "zips": [p for p in sys.path if "pyspark" in p],
               "daemon": sys.modules["__main__"].__file__}  # the worker was forked from it

    def ranks():
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        dist.destroy_process_group()
        return int(total)

    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(origins).collect()
    squares = [r[0] for r in spark.range(4).select(udf(lambda x: x * x, "long")("id")).collect()]
    print(json.dumps({"seen": seen, "squares": squares, "ranks": Distributor(num_processes=2).run(ranks)}))
    spark.stop()
""")


def test_a_session_with_it_runs_python_tasks_and_training_on_the_installed_pyspark(tmp_path):
    import py4j
    import pyspark

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    result = run_command([sys.executable, "-c", SESSION], timeout=240, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["squares"] == [0, 1, 4, 9] and report["ranks"] == 3  # a Python UDF; 2 DDP ranks over gloo
    installed = os.path.dirname(pyspark.__file__)  # this process imports the package, not a zip
    lib = os.path.join(installed, "python", "lib")
    py4j_zip = next(f for f in os.listdir(lib) if f.startswith("py4j-"))
    # py4j from the package only where it is the zip's version (not on the 3.5 line: 0.10.9.7 zipped).
    py4j_from_package = py4j_zip == f"py4j-{py4j.__version__}-src.zip"
    for worker in report["seen"]:
        assert worker["daemon"] == spark_dist_daemon.__file__
        assert worker["pyspark"] == os.path.join(installed, "__init__.py")
        assert os.path.join(lib, "pyspark.zip") not in worker["zips"]
        assert (worker["py4j"] == py4j.__file__) is py4j_from_package, worker
        assert (os.path.join(lib, py4j_zip) in worker["zips"]) is not py4j_from_package, worker
