"""TrainContext's checkpoints live in spark_dist.task.checkpoints (RankCheckpoints); the context keeps its public
methods, with their signatures, and hands each call over. No JVM."""
import inspect
import logging
import os

import pytest

torch = pytest.importorskip("torch")

from spark_dist.task import context  # noqa: E402
from spark_dist.task.context import TrainContext  # noqa: E402
from spark_dist.task import checkpoints  # noqa: E402
from spark_dist.errors import CheckpointReadError  # noqa: E402

SIGNATURES = {
    "save_checkpoint": "(self, obj, *, sharded: 'Optional[bool]' = None, async_save: 'bool' = False, "
                       "keep: 'Optional[int]' = None, metric: 'Optional[str]' = None, mode: 'str' = 'min') -> 'None'",
    "load_checkpoint": "(self, default=None, *, into=None)",
    "wait_for_checkpoints": "(self) -> 'None'",
}


def test_the_public_checkpoint_api_of_the_context_is_unchanged():
    for name, signature in SIGNATURES.items():
        assert str(inspect.signature(getattr(TrainContext, name))) == signature, name
    assert context.CHECKPOINT_FILE == checkpoints.CHECKPOINT_FILE == "checkpoint.pt"


def test_the_context_hands_checkpoints_to_rank_checkpoints(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(checkpoints.RankCheckpoints, "save", lambda self, obj, **kw: calls.append(("save", kw)))
    monkeypatch.setattr(checkpoints.RankCheckpoints, "load",
                        lambda self, default=None, *, into=None: calls.append(("load", default, into)) or "state")
    ctx = TrainContext(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, attempt=0, run_id="r",
                       host="h", checkpoint_dir=str(tmp_path / "run"))
    ctx.wait_for_checkpoints()  # nothing saved yet: nothing to wait for, and no directory needed
    ctx.save_checkpoint({"w": 1}, sharded=True, keep=2, metric="loss", mode="max")
    assert ctx.load_checkpoint("fresh", into=None) == "state"
    assert calls == [("save", {"sharded": True, "async_save": False, "keep": 2, "metric": "loss", "mode": "max"}),
                     ("load", "fresh", None)]


def test_a_run_without_a_checkpoint_directory_says_so_on_use_only():
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                       host="h")
    ctx.wait_for_checkpoints()
    with pytest.raises(RuntimeError, match="this run has no checkpoint directory"):
        ctx.save_checkpoint({"w": torch.ones(1)})


def one_rank(tmp_path):
    return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0, run_id="r",
                        host="h", checkpoint_dir=str(tmp_path / "run"))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.fstat(f.fileno()).st_size // 2)


def test_a_checkpoint_damaged_after_it_was_written_gives_way_to_the_one_before_it(tmp_path, caplog):
    ctx = one_rank(tmp_path)
    for step in range(3):
        ctx.save_checkpoint({"step": step, "w": torch.full((4,), float(step))})
    latest = tmp_path / "run" / checkpoints.CHECKPOINT_FILE
    truncate(latest)  # a disk that lost the end of it, a copy cut short
    with caplog.at_level(logging.WARNING, logger="spark_dist"):
        assert one_rank(tmp_path).load_checkpoint()["step"] == 1
    assert any(str(latest) in r.getMessage() and "the one before it" in r.getMessage() for r in caplog.records)
    truncate(tmp_path / "run" / checkpoints.PREVIOUS_FILE)
    with pytest.raises(CheckpointReadError) as info:
        one_rank(tmp_path).load_checkpoint()
    assert str(latest) in str(info.value) and "delete it to start the run from the beginning" in str(info.value)
    latest.unlink()  # deleted, not damaged: the run starts over (the one before is not taken for it)
    assert one_rank(tmp_path).load_checkpoint("fresh") == "fresh"
