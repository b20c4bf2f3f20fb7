"""What the ranks print reaches the driver's sys.stdout / sys.stderr, each line prefixed with its rank."""
import contextlib
import io
import logging
import os
import re
import signal
import sys
import threading
import time

import pytest

from spark_dist import ConfigError, Distributor, TrainingFailedError, get_context


def print_lines(count):
    rank = get_context().rank
    for i in range(count):
        print(f"line {i} of rank {rank}")
    print(f"to stderr from rank {rank}", file=sys.stderr)
    logging.getLogger("user").warning("logged by rank %d", rank)
    return rank


def lines_of(text, rank):
    return [line[len(f"[rank {rank}] "):] for line in text.splitlines() if line.startswith(f"[rank {rank}] ")]


def run_captured(distributor, fn, *args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = distributor.run(fn, *args)
        except TrainingFailedError as exc:
            result = exc
    return result, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("local_mode", [False, True])
def test_ten_thousand_lines_from_each_rank_arrive_complete_and_in_order(spark_local, local_mode):
    d = Distributor(num_processes=2, local_mode=local_mode, verbose=False, log_ranks="all")
    result, out, err = run_captured(d, print_lines, 10_000)
    assert result == 0
    for rank in (0, 1):
        assert lines_of(out, rank) == [f"line {i} of rank {rank}" for i in range(10_000)]
        assert f"to stderr from rank {rank}" in lines_of(err, rank)
        assert any(line.endswith(f"logged by rank {rank}") for line in lines_of(err, rank))


LINE_BYTES = 64 << 10


def print_a_gigabyte():
    """1 GiB in 64 KiB lines, each numbered, from rank 0 (rank 1 prints one line)."""
    if get_context().rank == 1:
        print("rank 1 is here")
        return
    body = "y" * (LINE_BYTES - 12)
    write = sys.stdout.write
    for i in range((1 << 30) // LINE_BYTES):
        write(f"{i:10d} {body}\n")


class CountingSink(io.TextIOBase):
    """A driver's stdout that checks each relayed line's number and keeps nothing."""

    def __init__(self):
        self.lines, self.bytes, self.in_order, self.others = 0, 0, True, []

    def write(self, text):
        for line in text.splitlines():
            if line.startswith("[rank 0] "):
                self.in_order &= int(line[9:19]) == self.lines
                self.lines += 1
                self.bytes += len(line) - 9 + 1
            elif line:
                self.others.append(line)
        return len(text)


def test_a_gigabyte_printed_by_a_rank_arrives_whole_while_the_drivers_memory_stays_flat(spark_local):
    import psutil

    d = Distributor(num_processes=2, local_mode=True, verbose=False, log_ranks="all")
    d.run(print_lines, 1)  # what any run imports and starts (torch, the store) is not the lines' cost
    process, peak, sampling = psutil.Process(), [0], [True]
    baseline = process.memory_info().rss

    def sample():
        while sampling[0]:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sink = CountingSink()
    try:
        # Local mode: the ranks' supervisors run in the driver too, so their buffers count here as well.
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(io.StringIO()):
            d.run(print_a_gigabyte)
    finally:
        sampling[0] = False
        sampler.join()
    assert sink.lines == (1 << 30) // LINE_BYTES and sink.bytes == 1 << 30 and sink.in_order
    assert sink.others == ["[rank 1] rank 1 is here"]
    assert (peak[0] - baseline) < 64 << 20, f"the driver grew by {(peak[0] - baseline) >> 20} MiB"


def print_long_line():
    print("x" * 100_000 + "!")


def test_a_100_kb_line_arrives_whole(spark_local):
    _, out, _ = run_captured(Distributor(num_processes=2, verbose=False, log_ranks="rank0"), print_long_line)
    assert lines_of(out, 0) == ["x" * 100_000 + "!"] and lines_of(out, 1) == []  # rank 0 only


def print_then_get_killed():
    rank = get_context().rank
    print(f"rank {rank} is about to die")
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def test_the_last_line_before_a_sigkill_arrives(spark_local):
    result, out, _ = run_captured(Distributor(num_processes=2, verbose=False, log_ranks="all"), print_then_get_killed)
    assert isinstance(result, TrainingFailedError) and result.rank == 1
    assert lines_of(out, 1) == ["rank 1 is about to die"]


def draw_a_progress_bar():
    from tqdm import tqdm

    for _ in tqdm(range(2000), file=sys.stderr, mininterval=0, miniters=1):
        time.sleep(0.0005)
    print("done")


def test_a_progress_bar_is_rate_limited_to_its_latest_state(spark_local):
    _, out, err = run_captured(Distributor(num_processes=1, verbose=False, log_ranks="all"), draw_a_progress_bar)
    bar = lines_of(err, 0)
    assert 1 <= len(bar) <= 20  # ~1 s of redraws: one state every 0.5 s, not 2000
    assert re.search(r"100%\|.*\| 2000/2000", bar[-1]) and lines_of(out, 0) == ["done"]


def test_nothing_is_shown_with_log_ranks_none_and_a_bad_value_is_refused(spark_local):
    _, out, err = run_captured(Distributor(num_processes=2, verbose=False), print_lines, 3)
    assert "[rank" not in out + err
    with pytest.raises(ConfigError, match="log_ranks must be one of 'all', 'rank0', 'none', got 'some'"):
        Distributor(num_processes=2, log_ranks="some")


def train_on_the_loader():
    ctx = get_context()
    for epoch in range(2):
        for _ in ctx.loader("train", batch_size=10, epoch=epoch):
            time.sleep(0.01)
        ctx.report(epoch=epoch, loss=0.5 / (epoch + 1))


def test_a_progress_bar_follows_rank_0s_loader_with_its_metrics(spark_local):
    df = spark_local.range(160).selectExpr("array(cast(id as float)) as x", "id % 2 as label")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        d = Distributor(num_processes=2, verbose=True, log_ranks="none")
        d.run(train_on_the_loader, datasets={"train": df})
    text = err.getvalue()
    # tqdm redraws with \\r; its last state per epoch: 8 of 8 steps (80 rows per rank, batches of 10).
    assert re.search(r"epoch 0: 100%\|.*\| 8/8", text) and re.search(r"epoch 1: 100%\|.*\| 8/8 .*loss=0\.25", text)
    assert "_progress" not in str(d.history)  # progress is the bar's, not history
    quiet = io.StringIO()
    with contextlib.redirect_stderr(quiet):
        Distributor(num_processes=2, verbose=False).run(train_on_the_loader, datasets={"train": df})
    assert "epoch 0" not in quiet.getvalue()
