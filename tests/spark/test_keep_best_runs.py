"""Keep-best retention through a real run (2 ranks on local[2]): sharded checkpoints saved with ``keep=1`` and a
``metric`` that rank 0 alone reports, some scores NaN or infinite. The best one stays on disk, and the driver's
``best_checkpoint`` names it. tests/unit/test_keep_best.py checks the ranking itself."""
import math

import pytest

from spark_dist import Distributor
from spark_dist.task import sharded_checkpoints

pytest.importorskip("pyspark")


def save_each_score(scores, mode):
    """Every rank saves a tiny model after each score; rank 0 alone reports it (the common pattern)."""
    import torch
    import torch.distributed as dist

    from spark_dist import get_context

    ctx = get_context()
    dist.init_process_group("gloo")
    model = torch.nn.Linear(2, 1)
    for step, score in enumerate(scores):
        if ctx.rank == 0:
            ctx.report(val_loss=score)
        ctx.save_checkpoint({"model": model, "step": step}, sharded=True, keep=1, metric="val_loss", mode=mode)
    dist.destroy_process_group()


@pytest.mark.parametrize("scores, mode, best", [
    ([math.nan, 0.3, 0.5, math.nan, 0.6], "min", 2),
    ([math.nan, 0.5, 0.7, math.inf, 0.2], "max", 3),
])
def test_keep_best_keeps_the_best_whatever_nans_the_run_reports(spark_local, tmp_path, scores, mode, best):
    run_id = f"keep-best-{mode}"
    d = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path), run_id=run_id)
    d.run(save_each_score, scores, mode)
    kept = sharded_checkpoints.committed(str(tmp_path / run_id))
    assert [c.seq for c in kept] == [best, len(scores)]  # the best, and the latest to resume from
    assert kept[0].score == scores[best - 1]
    assert d.best_checkpoint == kept[0].path
    assert sharded_checkpoints.load_full(d.best_checkpoint)["step"] == best - 1
