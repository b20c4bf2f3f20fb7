"""spark_dist.data's driver side without a JVM: which cache URLs and hosts a run accepts, errors that cross processes,
and Petastorm's converter imported while the write runs."""
import threading
import time

import pytest

from spark_dist.data import DatasetError


def test_a_file_cache_is_refused_when_executors_are_on_other_hosts():
    from spark_dist.data.prepare import remote_hosts

    assert remote_hosts("127.0.0.1", ["127.0.0.1", "localhost", "127.0.0.2"]) == []
    assert remote_hosts("127.0.0.1", ["127.0.0.1", "10.1.2.3"]) == ["10.1.2.3"]


def test_petastorms_converter_module_is_imported_while_the_write_runs(tmp_path, monkeypatch):
    # The driver needs Petastorm's converter module (slow to import) only after the write: it imports it
    # meanwhile, in a thread of its own, and a failed import is raised by the caller's own import afterwards.
    import importlib
    import sys
    import uuid

    from spark_dist.data.prepare.write import _importing_meanwhile

    slow, broken = (f"spark_dist_test_{kind}_{uuid.uuid4().hex}" for kind in ("slow", "broken"))
    (tmp_path / f"{slow}.py").write_text(
        "import threading, time\nIMPORTED_BY = threading.current_thread().name\ntime.sleep(0.5)\n"
        "DONE_AT = time.monotonic()\n")
    (tmp_path / f"{broken}.py").write_text("raise ImportError('a dependency left out on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    try:
        with _importing_meanwhile(slow):
            block_started = time.monotonic()         # the block (the write) does not wait for the import
        module = sys.modules[slow]                   # and the import is done once the block is
        assert block_started < module.DONE_AT
        assert module.IMPORTED_BY == "spark_dist-import" != threading.current_thread().name
        with _importing_meanwhile(broken):
            pass
        assert escaped == []                         # the thread kept its error to itself ...
        with pytest.raises(ImportError, match="left out on purpose"):
            importlib.import_module(broken)          # ... for the caller's own import to raise
    finally:
        for name in (slow, broken):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("user_first_by", [0.02, 0.1])
def test_a_users_thread_importing_petastorm_meanwhile_is_not_deadlocked(user_first_by):
    # A fresh process: the user's thread runs `from petastorm.spark import ...` while our thread imports the
    # converter module for a write. Importing the submodule first would take its lock before its package's, the
    # reverse of the user's order, and Python would raise _DeadlockError in the user's import.
    import subprocess
    import sys

    code = f"""if True:
        import threading, time
        import spark_dist
        from spark_dist.data.prepare import write
        errors = []
        def users_import():
            try:
                from petastorm.spark import make_spark_converter  # noqa: F401
            except BaseException as exc:
                errors.append(repr(exc))
        user = threading.Thread(target=users_import)
        user.start()
        time.sleep({user_first_by})
        with write._importing_meanwhile(write._CONVERTER_MODULE):
            pass
        user.join()
        print(errors or "ok", write._import_top_down(write._CONVERTER_MODULE).__name__)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "petastorm.spark.spark_dataset_converter"]


def test_dataset_errors_keep_their_dataset_and_column_across_processes():
    import pickle

    err = pickle.loads(pickle.dumps(DatasetError("dataset 'd': column 'x' has 1 null values", "d", "x")))
    assert (str(err), err.dataset, err.column) == ("dataset 'd': column 'x' has 1 null values", "d", "x")


@pytest.mark.parametrize("url, opened", [
    ("s3a://bucket/cache/part-0.parquet", "s3://bucket/cache/part-0.parquet"),
    ("s3n://bucket/part-0.parquet", "s3://bucket/part-0.parquet"),
    ("dbfs:/tmp/cache/part-0.parquet", "file:///dbfs/tmp/cache/part-0.parquet"),
    ("hdfs://nn:8020/cache/part-0.parquet", "hdfs://nn:8020/cache/part-0.parquet"),
    ("file:///tmp/cache/part-0.parquet", "file:///tmp/cache/part-0.parquet"),
])
def test_spark_schemes_map_to_what_the_ranks_reader_opens(url, opened):
    from spark_dist.data.urls import readable_url

    assert readable_url(url) == opened
