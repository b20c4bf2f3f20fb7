"""Keep-best retention of sharded checkpoints and ``Distributor.best_checkpoint``: one ranking for both, where a
NaN or infinite score ranks last; a torn or older marker is skipped, not fatal; the metric is rank 0's. Ranks
here are this process (one rank) or processes this test spawns over gloo (two); no Spark. A real run keeping
the best is in tests/spark/test_keep_best_runs.py."""
import json
import logging
import math
import os

import pytest

torch = pytest.importorskip("torch")

from spark_dist.task.context import TrainContext  # noqa: E402
from spark_dist.task import sharded_checkpoints  # noqa: E402
from tests.unit.gloo_ranks import run_ranks  # noqa: E402

NAN, INF = math.nan, math.inf


def one_rank(directory, reports):
    return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0,
                        run_id="r", host="h", checkpoint_dir=str(directory), _reporter=reports.append)


def save_scores(ctx, scores, mode, keep=1):
    model = torch.nn.Linear(2, 1)
    for i, score in enumerate(scores):
        ctx.report(val_loss=score)
        ctx.save_checkpoint({"model": model, "step": i}, sharded=True, keep=keep, metric="val_loss", mode=mode)


def best_on_the_driver(reports):
    from spark_dist.driver.distributor import Distributor

    d = Distributor(num_processes=1, local_mode=True, verbose=False)
    for record in reports:
        d._on_report(record)
    return d


@pytest.mark.parametrize("scores, mode, best", [
    ([NAN, 0.3, 0.5, NAN, 0.6], "min", 2),
    ([0.5, NAN, 0.3, 0.4, NAN], "min", 3),
    ([0.5, -INF, 0.3, 0.4, 0.45], "min", 3),
    ([NAN, 0.5, 0.7, INF, 0.2], "max", 3),
    ([0.1, NAN, 0.7, -INF, 0.2, NAN], "max", 3),
])
def test_a_non_finite_score_ranks_last_so_the_best_is_never_removed(tmp_path, scores, mode, best):
    reports = []
    save_scores(one_rank(tmp_path / "run", reports), scores, mode)
    kept = sharded_checkpoints.committed(str(tmp_path / "run"))
    assert [c.seq for c in kept] == [best, len(scores)]  # the best, and the latest to resume from
    d = best_on_the_driver(reports)
    assert d.best_checkpoint == kept[0].path
    assert [c["seq"] for c in d.checkpoints] == [best, len(scores)]


def test_without_any_finite_score_the_latest_are_kept_and_named(tmp_path):
    reports = []
    save_scores(one_rank(tmp_path / "run", reports), [NAN, INF, NAN], "min", keep=2)
    kept = sharded_checkpoints.committed(str(tmp_path / "run"))
    assert [c.seq for c in kept] == [2, 3]
    assert best_on_the_driver(reports).best_checkpoint == kept[-1].path


def test_a_run_resumed_under_its_run_id_names_the_best_an_earlier_run_of_it_kept(tmp_path):
    # The chaos campaign's sharded workload, its driver interrupted: the same run_id run again by a new
    # Distributor, whose own saves all score worse than one the interrupted run committed.
    save_scores(one_rank(tmp_path / "run", []), [NAN, 0.3, 0.5], "min", keep=2)
    reports = []
    save_scores(one_rank(tmp_path / "run", reports), [0.6, 0.4, 0.7], "min", keep=2)
    kept = sharded_checkpoints.committed(str(tmp_path / "run"))
    assert [(c.seq, c.score) for c in kept] == [(2, 0.3), (5, 0.4), (6, 0.7)]
    d = best_on_the_driver(reports)
    assert d.best_checkpoint == kept[0].path
    assert [c["seq"] for c in d.checkpoints] == [2, 5, 6]


@pytest.mark.parametrize("missing", ["time", "world_size"])
def test_a_marker_missing_a_field_is_skipped_as_torn_with_a_warning(tmp_path, caplog, missing):
    reports = []
    ctx = one_rank(tmp_path / "run", reports)
    save_scores(ctx, [0.5, 0.4], "min", keep=None)
    first = sharded_checkpoints.committed(str(tmp_path / "run"))[0]
    marker = os.path.join(first.path, sharded_checkpoints.MARKER)
    with open(marker) as f:
        fields = json.load(f)
    del fields[missing]
    with open(marker, "w") as f:  # as an older version, or a hand, may have written it
        json.dump(fields, f)
    with caplog.at_level(logging.WARNING, logger="spark_dist"):
        assert [c.seq for c in sharded_checkpoints.committed(str(tmp_path / "run"))] == [2]
    assert any(first.path in r.getMessage() and missing in r.getMessage() for r in caplog.records)
    save_scores(ctx, [0.3], "min", keep=1)  # a later save and load go on
    assert ctx.load_checkpoint()["step"] == 0


# -- two ranks: only rank 0 reports the metric ----------------------------------------------------------------
def rank_zero_reports(ctx):
    model = torch.nn.Linear(2, 1)
    for i, loss in enumerate([NAN, 0.3, 0.5]):
        if ctx.rank == 0:  # the common pattern: only rank 0 reports validation metrics
            ctx.report(val_loss=loss)
        else:
            ctx.report(acc=0.9)
        ctx.save_checkpoint({"model": model, "step": i}, sharded=True, keep=1, metric="val_loss")
    try:  # rank 0 never reported acc: every rank refuses alike (none is left waiting in a collective)
        ctx.save_checkpoint({"model": model}, sharded=True, metric="acc")
    except ValueError as exc:
        return str(exc)
    return None


def test_the_metric_is_rank_zeros_and_only_rank_zero_needs_to_report_it(tmp_path):
    directory = str(tmp_path / "run")
    ranks = run_ranks(2, directory, rank_zero_reports, tmp_path)
    assert [(c.seq, c.score) for c in sharded_checkpoints.committed(directory)] == [(2, 0.3), (3, 0.5)]
    for out in ranks:
        assert "metric 'acc' was never reported by rank 0" in out["result"]
        assert "reported so far: val_loss" in out["result"]  # rank 0's metrics, named on every rank
