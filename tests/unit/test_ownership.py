"""Checkpoints are read through checked descriptors (spark_dist.host.ownership): a sharded checkpoint, a rank's
``checkpoint.pt`` and what ``read_checkpoint`` unpickles are refused under a symbolic link or a parent others can
write, the error naming the path; what is read is the directory that was checked. No JVM."""
import datetime
import os
import stat

import pytest

torch = pytest.importorskip("torch")

from spark_dist.task.context import TrainContext  # noqa: E402
from spark_dist.inference import read_checkpoint  # noqa: E402
from spark_dist.task import sharded_checkpoints  # noqa: E402
from spark_dist.task.checkpoint_dirs import CheckpointDirError  # noqa: E402


def rank0(directory):
    return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0,
                        run_id="r", host="h", checkpoint_dir=str(directory))


def sharded(directory, step=1):
    rank0(directory).save_checkpoint({"model": torch.nn.Linear(2, 1), "step": step}, sharded=True)
    return sharded_checkpoints.committed(str(directory))[-1].path


def open_to_others(path, sticky=False):
    os.chmod(path, 0o1777 if sticky else 0o777)


def test_a_symlinked_sharded_directory_is_refused_naming_it(tmp_path):
    run = tmp_path / "run"
    sharded(run)
    root = run / sharded_checkpoints.SHARDED_DIR
    os.rename(root, tmp_path / "moved")  # the run's sharded/ swapped for a link to a directory of ours
    os.symlink(tmp_path / "moved", root)
    with pytest.raises(CheckpointDirError, match=f"{root} is a symbolic link"):
        sharded_checkpoints.committed(str(run))
    with pytest.raises(CheckpointDirError, match=f"{root} is a symbolic link"):
        rank0(run).load_checkpoint()


def test_a_symlinked_checkpoint_is_refused_naming_it(tmp_path):
    path = sharded(tmp_path / "run")
    link = tmp_path / "link"
    os.symlink(path, link)
    with pytest.raises(CheckpointDirError, match=f"{link} is a symbolic link"):
        sharded_checkpoints.load_full(str(link))


@pytest.mark.parametrize("reader", ["load_full", "load_checkpoint", "read_checkpoint"])
def test_a_sharded_checkpoint_under_a_parent_others_can_write_is_refused(tmp_path, reader):
    shared = tmp_path / "shared"
    path = sharded(shared / "run")
    open_to_others(shared)
    with pytest.raises(CheckpointDirError) as info:
        if reader == "load_full":
            sharded_checkpoints.load_full(path)
        elif reader == "load_checkpoint":
            rank0(shared / "run").load_checkpoint()
        else:
            read_checkpoint(path)
    assert f"under {shared}, which others can write" in str(info.value)
    assert "not this user's alone" in str(info.value)


def test_a_parent_others_can_write_is_fine_when_sticky(tmp_path):
    shared = tmp_path / "shared"
    path = sharded(shared / "run", step=4)
    open_to_others(shared, sticky=True)  # as /tmp: nobody else can rename what is ours in it
    assert sharded_checkpoints.load_full(path)["step"] == 4


def test_a_rank_zero_checkpoint_under_a_parent_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    ctx = rank0(shared / "run")
    ctx.save_checkpoint({"epoch": 1, "saved": datetime.date(2026, 1, 2)})  # not tensors alone: unpickled
    open_to_others(shared)
    with pytest.raises(CheckpointDirError, match=f"{shared / 'run'} is under {shared}, which others can write"):
        ctx.load_checkpoint()
    with pytest.raises(CheckpointDirError, match=f"under {shared}, which others can write"):
        ctx.save_checkpoint({"epoch": 2})
    with pytest.raises(CheckpointDirError, match="holds objects other than tensors.*under .*which others can write"):
        read_checkpoint(shared / "run")


def test_what_is_read_is_the_directory_that_was_checked(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import FileSystemReader

    path = sharded(tmp_path / "run", step=1)
    planted = sharded(tmp_path / "other", step=666)
    read_metadata = FileSystemReader.read_metadata
    done = []

    def swapped(self, *args, **kwargs):  # once checked, the path is made to name another checkpoint
        if not done:
            os.rename(path, str(tmp_path / "aside"))
            os.rename(planted, path)
            done.append(True)
        return read_metadata(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemReader, "read_metadata", swapped)
    assert sharded_checkpoints.load_full(path)["step"] == 1


def test_a_file_in_a_checkpoint_others_can_write_is_refused_naming_it(tmp_path):
    path = sharded(tmp_path / "run")
    os.chmod(os.path.join(path, ".metadata"), 0o666)
    with pytest.raises(CheckpointDirError, match=f"{os.path.join(path, '.metadata')} is of mode 0666"):
        sharded_checkpoints.load_full(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_no_private_dcp_name_is_imported():
    """torch.distributed.checkpoint's private names move between releases: spark_dist uses public ones."""
    import ast

    package = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "spark_dist")
    private = []
    for folder, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed.checkpoint"):
                    parts = node.module.split(".") + [alias.name for alias in node.names]
                    private += [f"{os.path.relpath(path, package)}: {node.module}: {p}" for p in parts
                                if p.startswith("_")]
    assert private == []
