"""The driver's progress bar shows the rate rank 0 measured, not the rate at which updates reached the driver."""
import contextlib
import io

from spark_dist.task import context
from spark_dist.task.context import TrainContext
from spark_dist.task.output import ProgressBar


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Sent(list):
    def progress(self, value):
        self.append(value)


def test_rank_0_measures_its_own_steps_per_second(monkeypatch):
    clock, sent = Clock(), Sent()
    monkeypatch.setattr(context.time, "monotonic", clock)
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0,
                       run_id="r", host="h", _reporter=sent)
    for step in range(1, 24):  # a 23-step epoch at 10 steps/s
        ctx._progress(0, step, 23)
        clock.now += 0.1
    epoch, step, steps, rate, finished = sent[-1]
    assert (epoch, step, steps) == (0, 23, 23) and abs(rate - 10.0) < 1e-6 and finished is None
    assert len(sent) <= 23 * 0.1 / context.PROGRESS_EVERY_S + 2  # at most every PROGRESS_EVERY_S, and the end
    clock.now += 60  # the next epoch's rate starts afresh
    ctx._progress(1, 1, 23)
    clock.now += 0.5
    ctx._progress(1, 2, 23)
    assert sent[-1][3] == 2.0 and sent[-1][4][:2] == (0, 23) and abs(sent[-1][4][2] - 10.0) < 1e-6


def test_the_bar_shows_the_ranks_rate_whenever_the_updates_arrive():
    bar, out = ProgressBar(), io.StringIO()
    with contextlib.redirect_stderr(out):
        bar.advance(0, 1, 23, None)
        bar.show_metrics({"loss": 0.25})
        bar.advance(0, 23, 23, 10.0)  # the last update arrives right after the first on the driver
        bar.close()
    last = out.getvalue().split("\r")[-1]
    assert "23/23" in last and last.rstrip().endswith("10 step/s, loss=0.25]")
    assert "it/s" not in out.getvalue()
