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


def test_a_publisher_asks_the_store_for_room_once_in_eight_chunks_and_every_line_arrives_in_order():
    from spark_dist.task import output
    from spark_dist.task.output import LineBuffer, OutputRelay, Publisher
    from spark_dist.wire.sealed_store import SealedStore, host_store, join_store

    server, port = host_store("127.0.0.1", 5.0)
    driver = SealedStore(server, b"k" * 32, "run")
    store = SealedStore(join_store("127.0.0.1", port, 2.0), b"k" * 32, "run")
    round_trips = []
    queue_len = store.queue_len
    store.queue_len = lambda name: round_trips.append(name) or queue_len(name)
    lines, shown = LineBuffer(), []
    publisher = Publisher(store, 3, lines)
    relay = OutputRelay(driver, lambda rank, stream, line: shown.append((rank, line)))
    for i in range(16):
        lines.add("stdout", f"line {i}")
        publisher.publish(final=True)  # one chunk each
        relay.drain()
    assert len(round_trips) == 16 // output.CONFIRM_EVERY
    big = "x" * (output.CONFIRM_BYTES // 2)
    for _ in range(2):  # two chunks of half the bytes: the second asks
        lines.add("stdout", big)
        publisher.publish(final=True)
    assert len(round_trips) == 16 // output.CONFIRM_EVERY + 1
    relay.drain()
    assert shown == [(3, f"line {i}") for i in range(16)] + [(3, big)] * 2
