"""The output relay without Spark (spark_dist.task.output): a broken channel."""
import io
import os
import time


def test_a_broken_channel_leaves_the_lines_in_the_executor_log_and_warns_once(capsys):
    from spark_dist.task.output import LineBuffer, Publisher, StreamReader
    from spark_dist.wire.sealed_store import SealedStore, host_store, join_store

    server, port = host_store("127.0.0.1", 5.0)
    store = SealedStore(join_store("127.0.0.1", port, 2.0), b"k" * 32, "run")
    lines, executor_log = LineBuffer(), io.BytesIO()
    read_fd, write_fd = os.pipe()
    reader = StreamReader(read_fd, "stdout", lines, executor_log)
    reader.start()
    publisher = Publisher(store, 0, lines)
    os.write(write_fd, b"before the break\n")
    time.sleep(0.2)
    publisher.publish(final=True)
    assert store.queue_len("output") == 1
    del server  # the driver's store goes away: its port closes
    for text in (b"after the break\n", b"and later\n"):
        os.write(write_fd, text)
        time.sleep(0.2)
        publisher.publish(final=True)  # raises nothing: training goes on
    os.close(write_fd)
    reader.join()
    assert executor_log.getvalue() == b"before the break\nafter the break\nand later\n"
    assert capsys.readouterr().err.count("rank 0's output no longer reaches the driver") == 1


def test_progress_states_count_into_the_buffer_bound_and_taking_them_returns_it_to_zero():
    from spark_dist.task import output
    from spark_dist.task.output import LineBuffer

    lines = LineBuffer()
    for i in range(5):
        lines.progress("stderr", f"{i}" * 50 + "\r")  # each update is due now: appended at once
        assert lines._bytes == 51
        assert lines.take(final=True) == [("stderr", f"{i}" * 50 + "\r")]
        assert lines._bytes == 0
        lines._progress["stderr"] = ("", time.monotonic() - output.PROGRESS_EVERY_S, False)  # the next is due
