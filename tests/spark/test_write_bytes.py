"""``files.write_bytes`` (a saved model's ``torch.pt``) writes a new file and never overwrites one, with the same
error on a classic session and under Spark Connect (where a task on an executor writes it)."""
import pytest

from spark_dist.data.prepare import files


def write_twice(spark, path):
    """Write ``path`` once, then again: the second write is refused and the file keeps the first bytes."""
    files.write_bytes(spark, path, b"first")
    with pytest.raises(FileExistsError) as raised:
        files.write_bytes(spark, path, b"second")
    assert str(raised.value) == str(files.file_exists(path))  # the same message, whichever session
    assert raised.value.filename == path and ".write().overwrite()" in str(raised.value)
    assert files.read_bytes(spark, path) == b"first"


def test_a_classic_session_refuses_to_overwrite(spark_local, tmp_path):
    write_twice(spark_local, str(tmp_path / "model" / "torch.pt"))
    write_twice(spark_local, (tmp_path / "url.pt").as_uri())


def test_spark_connect_refuses_to_overwrite_as_a_classic_session_does(spark_connect, tmp_path):
    write_twice(spark_connect, str(tmp_path / "model" / "torch.pt"))
    write_twice(spark_connect, (tmp_path / "url.pt").as_uri())


