"""spark_dist.data.prepare.files without Spark: a file system with no exclusive create is checked before the write."""
from spark_dist.data.prepare import files


def test_a_file_system_without_exclusive_create_is_checked_before_the_write(tmp_path):
    # What an executor does under Connect for hdfs:, s3: and the like: pyarrow's file system for the scheme.
    from pyarrow import fs as pafs

    filesystem, path = pafs.LocalFileSystem(), str(tmp_path / "torch.pt")
    assert files.write_new_pyarrow_file(filesystem, path, b"first")
    assert not files.write_new_pyarrow_file(filesystem, path, b"second")
    assert (tmp_path / "torch.pt").read_bytes() == b"first"
