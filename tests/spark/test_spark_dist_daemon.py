"""spark_dist_daemon: PySpark's daemon, importing the installed PySpark instead of Spark's zip of it.

The suite's shared local session names it (``spark.python.daemon.module=spark_dist_daemon``), as a user opts in and
as ``spark-dist run`` names it in the sessions it creates; the ranks of every test on it start from its workers (a
session that does not name it keeps PySpark's daemon: tests/spark/test_python_daemon.py). The choice of what to
drop is shown on folders laid out like a pip-installed PySpark and like a Spark distribution.
"""
import os
import sys
import zipfile

import spark_dist_daemon
from spark_dist_daemon import zips_of_installed_packages


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


def _origins(_):
    import py4j
    import pyspark
    yield {"pyspark": pyspark.__file__, "py4j": py4j.__file__, "zips": [p for p in sys.path if "pyspark" in p],
           "daemon": sys.modules["__main__"].__file__}  # the worker was forked from it


def test_a_session_with_it_runs_python_tasks_on_the_installed_pyspark(spark_local):
    """The suite's local session names it in its conf, as ``spark-dist run`` does (tests/clusters.py): every test
    on it runs its Python tasks and ranks under it."""
    import py4j
    import pyspark
    from pyspark.sql.functions import udf

    assert spark_local.sparkContext.getConf().get("spark.python.daemon.module") == "spark_dist_daemon"
    seen = spark_local.sparkContext.parallelize(range(2), 2).mapPartitions(_origins).collect()
    squares = [r[0] for r in spark_local.range(4).select(udf(lambda x: x * x, "long")("id")).collect()]
    assert squares == [0, 1, 4, 9]  # a Python UDF
    installed = os.path.dirname(pyspark.__file__)  # this process imports the package, not a zip
    lib = os.path.join(installed, "python", "lib")
    py4j_zip = next(f for f in os.listdir(lib) if f.startswith("py4j-"))
    # py4j from the package only where it is the zip's version (not on the 3.5 line: 0.10.9.7 zipped).
    py4j_from_package = py4j_zip == f"py4j-{py4j.__version__}-src.zip"
    for worker in seen:
        assert worker["daemon"] == spark_dist_daemon.__file__
        assert worker["pyspark"] == os.path.join(installed, "__init__.py")
        assert os.path.join(lib, "pyspark.zip") not in worker["zips"]
        assert (worker["py4j"] == py4j.__file__) is py4j_from_package, worker
        assert (os.path.join(lib, py4j_zip) in worker["zips"]) is not py4j_from_package, worker
