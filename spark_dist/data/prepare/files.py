"""Whole files written once and read back anywhere Spark reads (a saved model's pickled objects): through the
driver JVM's Hadoop FileSystem on a classic session, through one small job on an executor under Spark Connect
(where the client may not reach the file system).
"""
from __future__ import annotations

import errno
import os

from ...spark import jvm
from ...spark.session import is_connect, run_on_executors
from ..urls import local_path, readable_url


def write_bytes(spark, path: str, data: bytes) -> None:
    """Write ``data`` as a new file at ``path`` (any scheme Spark writes). Under Spark Connect, where this
    client may not reach the file system, one task on an executor writes it (:func:`write_new_file`).

    Raises:
        FileExistsError: ``path`` exists (it is left as it was), alike on a classic session and under Connect.
    """
    if not is_connect(spark):
        try:
            return jvm.write_bytes(spark.sparkContext, path, data)  # Hadoop's create(path, overwrite=False)
        except Exception as exc:  # py4j's error for Hadoop's FileAlreadyExistsException
            if _java_class(exc) == "org.apache.hadoop.fs.FileAlreadyExistsException":
                raise file_exists(path) from exc
            raise
    if run_on_executors(spark, 1, lambda _index: [] if write_new_file(path, data) else [path]):
        raise file_exists(path)


def file_exists(path: str) -> FileExistsError:
    """The error :func:`write_bytes` raises for a ``path`` that exists."""
    return FileExistsError(errno.EEXIST, "spark_dist writes a new file and does not overwrite one: remove it, or "
                           "write elsewhere (a saved model or estimator: .write().overwrite().save(path))", path)


def _java_class(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    return java.getClass().getName() if java is not None else ""


def write_new_file(path: str, data: bytes) -> bool:
    """Write ``data`` as a new file at ``path`` from this process; ``False`` (and nothing written) when it
    exists. A local path is created exclusively (``open(..., "xb")``: no other writer can slip in between).
    Another scheme goes through pyarrow's file system for it, which has no exclusive create: the existence check
    comes right before the write, the window Hadoop's own ``create(overwrite=False)`` has on object stores."""
    from urllib.parse import urlparse

    local = path if not urlparse(path).scheme else local_path(path)
    if local is not None:
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        try:
            with open(local, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        return True
    from pyarrow import fs as pafs

    filesystem, fs_path = pafs.FileSystem.from_uri(readable_url(path))
    return write_new_pyarrow_file(filesystem, fs_path, data)


def write_new_pyarrow_file(filesystem, fs_path: str, data: bytes) -> bool:
    """:func:`write_new_file` through a pyarrow ``FileSystem``: ``False`` (nothing written) when it exists."""
    from pyarrow import fs as pafs

    if filesystem.get_file_info(fs_path).type != pafs.FileType.NotFound:
        return False
    with filesystem.open_output_stream(fs_path) as f:
        f.write(data)
    return True


def read_bytes(spark, path: str) -> bytes:
    """The whole file at ``path`` (any scheme Spark reads); under Connect through Spark's ``binaryFile``
    source (one small job)."""
    if not is_connect(spark):
        return jvm.read_bytes(spark.sparkContext, path)
    return bytes(spark.read.format("binaryFile").load(path).select("content").first()[0])
