"""A checkpoint that fills its disk ends in words: "disk full", the directory, what was being written; nothing
half-written is left and the checkpoint before it is intact. On a real full filesystem: a small tmpfs, which
needs root (CI runs as root)."""
import contextlib
import os
import subprocess

import pytest
import torch

from spark_dist.errors import DiskFullError
from spark_dist.task import checkpoint_dirs
from spark_dist.task.context import CHECKPOINT_FILE
from spark_dist.task.sharded_checkpoints import ShardedCheckpoints
from spark_dist.task.sharded_files import committed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_checkpoint_that_fills_the_disk_says_so_and_keeps_the_one_before(small_disk):
    with checkpoint_dirs.atomic_write(small_disk, CHECKPOINT_FILE) as f:
        torch.save({"step": 1}, f)
    with pytest.raises(DiskFullError, match="disk full: no space left") as full:
        with checkpoint_dirs.atomic_write(small_disk, CHECKPOINT_FILE) as f:
            torch.save({"step": 2, "weights": torch.zeros(1 << 20)}, f)  # 4 MiB on a 2 MiB disk
    assert full.value.directory == checkpoint_dirs.resolve(small_disk) and "checkpoint.pt" in str(full.value)
    assert full.value.errno == 28  # ENOSPC, for code that checks it
    with contextlib.closing(checkpoint_dirs.open_checked(small_disk, CHECKPOINT_FILE)) as f:
        assert torch.load(f, weights_only=False) == {"step": 1}
    assert sorted(os.listdir(checkpoint_dirs.resolve(small_disk))) == [CHECKPOINT_FILE]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_sharded_checkpoint_that_fills_the_disk_says_so_and_leaves_no_partial_directory(small_disk, async_save):
    saver = ShardedCheckpoints(small_disk, rank=0, world_size=1, report=lambda record: None)
    saver.save({"step": torch.tensor(1)})
    with pytest.raises(DiskFullError, match="disk full") as full:
        saver.save({"weights": torch.zeros(1 << 20)}, async_save=async_save)
        saver.wait()
    assert "sharded checkpoint" in str(full.value) and small_disk in full.value.directory
    assert [c.seq for c in committed(small_disk)] == [1]
    assert len(os.listdir(os.path.dirname(committed(small_disk)[0].path))) == 1  # the partial one is gone
