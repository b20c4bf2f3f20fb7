"""Petastorm on new pyarrow and numpy (spark_dist.data.prepare.petastorm_compat), without Spark: the patch reaches
Petastorm only."""
import os
import subprocess
import sys

import numpy as np
import pyarrow
import pyarrow.parquet as pq
import pytest

import spark_dist
from spark_dist.data.prepare import petastorm_compat


NEW_PYARROW = int(pyarrow.__version__.split(".")[0]) >= 16


NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_patch_reaches_petastorm_only():
    import petastorm.arrow_reader_worker as worker_module

    assert pq.ParquetDataset.__module__.startswith("pyarrow")  # everyone else's pyarrow is pyarrow's own
    if NUMPY_2:
        assert "unicode_" not in np.__dict__ and worker_module.np is not np
    else:
        assert worker_module.np is np
    if hasattr(pq, "ParquetDatasetPiece"):  # pyarrow 14: the legacy API is there, Petastorm uses it as is
        assert worker_module.pq is pq
    else:
        assert worker_module.pq is not pq
        assert worker_module.pq.ParquetFile is pq.ParquetFile  # everything else forwards
    import petastorm.fs_utils as fs_module

    if NEW_PYARROW:  # the removed legacy filesystem, on Petastorm's pyarrow alone
        assert fs_module.pyarrow is not pyarrow and fs_module.pyarrow.Table is pyarrow.Table
        assert fs_module.pyarrow.localfs.exists(__file__) and not hasattr(pyarrow, "localfs")
    else:
        assert fs_module.pyarrow is pyarrow


@pytest.mark.skipif(NEW_PYARROW, reason="the Spark 3.5 line's pyarrow 14 still has every name")
def test_nothing_changes_on_the_old_stack():
    import pyarrow.filesystem

    assert not petastorm_compat.needed()
    assert pyarrow.filesystem.__file__.startswith(os.path.dirname(pyarrow.__file__))  # pyarrow's own


@pytest.mark.skipif(not NEW_PYARROW, reason="pyarrow < 16 still has pyarrow.filesystem")
def test_petastorm_alone_fails_on_new_pyarrow_and_works_after_spark_dist():
    alone = _python("import petastorm.spark")
    assert alone.returncode != 0 and "pyarrow.filesystem" in alone.stderr  # why the module exists
    after = _python("import spark_dist, petastorm.spark, petastorm.reader; print(petastorm.reader.pq.ParquetDataset)")
    assert after.returncode == 0, after.stderr
    assert "petastorm_legacy_dataset" in after.stdout
    # Petastorm imported first (it fails), then spark_dist, then Petastorm again: the second import works.
    retry = _python("try:\n import petastorm\nexcept ImportError:\n pass\n"
                    "import spark_dist, petastorm.spark")
    assert retry.returncode == 0, retry.stderr


@pytest.mark.skipif(not NEW_PYARROW, reason="pyarrow < 16 still has its own legacy HDFS driver")
def test_legacy_hdfs_says_what_to_use_instead():
    from urllib.parse import urlparse

    from petastorm.hdfs.namenode import HdfsConnector

    with pytest.raises(NotImplementedError, match="file:// mount"):
        HdfsConnector.hdfs_connect_namenode(urlparse("hdfs://namenode:8020/data"))


# In a fresh interpreter: what pyarrow offers anyone, before spark_dist, after it, and after Petastorm read a
# Parquet file through it (its converter module and reader imported, its filesystem stand-ins used).
_PYARROW_AS_OTHERS_SEE_IT = """
import importlib, json, sys
import pyarrow, pyarrow.parquet as pq

def seen():
    try:
        importlib.import_module("pyarrow.filesystem")
        filesystem = True
    except ImportError:
        filesystem = False
    return {"filesystem": filesystem, "hdfs": hasattr(pyarrow, "hdfs"), "localfs": hasattr(pyarrow, "localfs"),
            "LocalFileSystem": hasattr(pyarrow, "LocalFileSystem"),
            "modules": sorted(m for m in ("pyarrow.filesystem", "pyarrow.hdfs") if m in sys.modules)}

before = seen()
import spark_dist
after_import = seen()
import petastorm.spark.spark_dataset_converter
from petastorm import make_batch_reader
pq.write_table(pyarrow.table({"label": list(range(20))}), sys.argv[1] + "/part-0.parquet")
with make_batch_reader("file://" + sys.argv[1], num_epochs=1) as reader:
    labels = sorted(v for batch in reader for v in batch.label.tolist())
print(json.dumps({"before": before, "after_import": after_import, "after_use": seen(), "labels": labels}))
"""


def test_pyarrow_looks_the_same_to_everyone_else_after_spark_dist_and_petastorm(tmp_path):
    import json

    run = subprocess.run([sys.executable, "-c", _PYARROW_AS_OTHERS_SEE_IT, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["labels"] == list(range(20))  # Petastorm read, with whatever it needed
    assert seen["after_import"] == seen["before"] and seen["after_use"] == seen["before"]
    if NEW_PYARROW:  # pyarrow 26 has none of these: nor may it seem to, to a library testing for them
        assert seen["before"] == {"filesystem": False, "hdfs": False, "localfs": False, "LocalFileSystem": False,
                                  "modules": []}


def test_petastorms_functions_pickled_for_spark_workers_keep_the_patch(tmp_path):
    # materialize_dataset's row-group summary job ships Petastorm closures to Spark's Python workers, which never
    # imported spark_dist: the proxies they refer to must unpickle as proxies there, not as the real pyarrow.
    import cloudpickle
    from petastorm.fs_utils import FilesystemResolver

    pq.write_table(pyarrow.table({"a": [1, 2, 3]}), str(tmp_path / "part.parquet"), row_group_size=1)
    factory = FilesystemResolver("file://" + str(tmp_path)).filesystem_factory()

    def row_groups(path):  # as petastorm.etl.dataset_metadata._generate_num_row_groups_per_file's closure
        f = factory().open(path)
        try:
            return pq.read_metadata(f).num_row_groups
        finally:
            f.close()

    shipped = cloudpickle.dumps(row_groups).hex()
    out = _python(f"import pickle, sys\nfn = pickle.loads(bytes.fromhex({shipped!r}))\n"
                  f"print(fn({str(tmp_path / 'part.parquet')!r}), 'spark_dist' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", str(petastorm_compat.needed())]  # spark_dist imported there only if needed
