"""Rank assignment is a pure function of where tasks run and which GPUs they hold."""
import pickle

import psutil

import pytest

from spark_dist.wire.ranks import TaskInfo, assign_ranks

from spark_dist.wire.sealed_store import SealedStore, bind_listener, host_store, join_store


def test_single_host_ranks_follow_task_order():
    ranks = assign_ranks([TaskInfo(0, "h"), TaskInfo(1, "h")])
    assert [(r.rank, r.local_rank, r.node_rank) for r in ranks] == [(0, 0, 0), (1, 1, 0)]
    assert all(r.world_size == 2 and r.local_world_size == 2 and r.num_nodes == 1 for r in ranks)


def test_two_hosts_rank_host_by_host_and_node_of_task_zero_first():
    tasks = [TaskInfo(0, "b"), TaskInfo(1, "a"), TaskInfo(2, "b"), TaskInfo(3, "a")]
    ranks = assign_ranks(tasks)
    # Returned in the order of the tasks given; host "b" holds task 0, so it is node 0.
    assert [(r.host, r.rank, r.local_rank, r.node_rank) for r in ranks] == [
        ("b", 0, 0, 0), ("a", 2, 0, 1), ("b", 1, 1, 0), ("a", 3, 1, 1)]
    assert [(r.cross_rank, r.cross_size) for r in ranks] == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_gpu_order_decides_local_rank_and_visible_devices():
    tasks = [TaskInfo(0, "h", ("1",)), TaskInfo(1, "h", ("0",)), TaskInfo(2, "g", ("0",))]
    ranks = assign_ranks(tasks)
    by_task = {t.task_index: r for t, r in zip(tasks, ranks)}
    assert by_task[1].local_rank == 0 and by_task[0].local_rank == 1
    # cuda:LOCAL_RANK is each task's own GPU within CUDA_VISIBLE_DEVICES.
    assert by_task[0].cuda_visible_devices == "0,1"
    assert by_task[0].cuda_visible_devices.split(",")[by_task[0].local_rank] == "1"
    assert by_task[2].cuda_visible_devices == "0" and by_task[2].node_rank == 1


def test_assignment_does_not_depend_on_arrival_order():
    tasks = [TaskInfo(i, f"h{i % 3}", (str(i // 3),)) for i in range(9)]
    forward = {r.rank: r for r in assign_ranks(tasks)}
    backward = {r.rank: r for r in assign_ranks(list(reversed(tasks)))}
    assert forward == backward
    assert sorted(forward) == list(range(9))


# Two Spark tasks on one host, each holding two GPUs ("0","1" and "2","3"): four process slots.
MULTI_GPU = [TaskInfo(0, "h", ("0",), "h:1", 0), TaskInfo(1, "h", ("1",), "h:1", 0),
             TaskInfo(2, "h", ("2",), "h:2", 1), TaskInfo(3, "h", ("3",), "h:2", 1)]


@pytest.mark.parametrize("layout, expected", [
    # (rank, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, CUDA_VISIBLE_DEVICES) per slot
    ("host", [(0, 0, 4, 0, "0,1,2,3"), (1, 1, 4, 0, "0,1,2,3"), (2, 2, 4, 0, "0,1,2,3"), (3, 3, 4, 0, "0,1,2,3")]),
    # PySpark 4.2+: each task a torchrun node running one process per GPU of the task.
    ("task", [(0, 0, 2, 0, "0,1"), (1, 1, 2, 0, "0,1"), (2, 0, 2, 1, "2,3"), (3, 1, 2, 1, "2,3")]),
])
def test_multi_gpu_tasks_give_every_rank_its_own_gpu_at_cuda_local_rank(layout, expected):
    ranks = assign_ranks(MULTI_GPU, layout)
    assert [(r.rank, r.local_rank, r.local_world_size, r.node_rank, r.cuda_visible_devices) for r in ranks] == expected
    for slot, rank in zip(MULTI_GPU, ranks):
        assert rank.cuda_visible_devices.split(",")[rank.local_rank] == slot.gpus[0]


def test_task_layout_makes_each_one_gpu_task_a_node_as_pyspark_does():
    tasks = [TaskInfo(0, "h", ("1",)), TaskInfo(1, "h", ("0",)), TaskInfo(2, "g", ("0",))]
    ranks = assign_ranks(tasks, "task")
    assert [(r.rank, r.local_rank, r.local_world_size, r.node_rank, r.num_nodes) for r in ranks] == [
        (0, 0, 1, 0, 3), (1, 0, 1, 1, 3), (2, 0, 1, 2, 3)]
    assert [r.cuda_visible_devices for r in ranks] == ["1", "0", "0"]  # only the task's own GPU


def test_gpu_numbers_order_numerically_and_gpu_names_after_them():
    # GPU 10 comes after GPU 9; a discovery script may give names (UUIDs): those sort by name, after the numbers.
    ranks = assign_ranks([TaskInfo(0, "h", ("10",)), TaskInfo(1, "h", ("9",)), TaskInfo(2, "h", ("GPU-b",)),
                          TaskInfo(3, "h", ("GPU-a",))])
    assert [r.local_rank for r in ranks] == [1, 0, 3, 2]
    assert ranks[0].cuda_visible_devices == "9,10,GPU-a,GPU-b"
    assert [r.gpus for r in ranks] == [("10",), ("9",), ("GPU-b",), ("GPU-a",)]  # each rank's own


def test_task_layout_keeps_the_order_spark_lists_a_tasks_gpus_in():
    # One Spark task holding GPUs "1" and "0", listed in that order, runs two slots.
    tasks = [TaskInfo(0, "h", ("1",), "h:1", 0), TaskInfo(1, "h", ("0",), "h:1", 0)]
    by_task = assign_ranks(tasks, "task")
    assert [(r.rank, r.local_rank) for r in by_task] == [(0, 0), (1, 1)] and by_task[0].cuda_visible_devices == "1,0"
    by_host = assign_ranks(tasks)  # a host's slots go by GPU number
    assert [(r.rank, r.local_rank) for r in by_host] == [(1, 1), (0, 0)] and by_host[0].cuda_visible_devices == "0,1"


def test_cross_rank_counts_only_the_nodes_that_have_that_local_rank():
    # Horovod's cross ranks: host "a" runs two slots, host "b" one, so local rank 1 exists on "a" alone.
    ranks = assign_ranks([TaskInfo(0, "a"), TaskInfo(1, "a"), TaskInfo(2, "b")])
    assert [(r.local_rank, r.cross_rank, r.cross_size) for r in ranks] == [(0, 0, 2), (1, 0, 1), (0, 1, 2)]


def test_listener_binds_the_given_address_only():
    sock = bind_listener("127.0.0.1")
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_sealed_store_rejects_forged_values_before_unpickling():
    server, port = host_store("127.0.0.1", 10)
    try:
        ours = SealedStore(join_store("127.0.0.1", port, 10), b"s" * 32, "run")
        ours.put("assignment", {"ranks": 2})
        assert ours.get("assignment") == {"ranks": 2}

        class Boom:
            def __reduce__(self):
                return (exec, ("raise SystemExit('unpickled a forged value')",))

        stranger = join_store("127.0.0.1", port, 10)
        stranger.set(ours.key("assignment"), b"\x00" * 32 + pickle.dumps(Boom()))
        with pytest.raises(PermissionError, match="did not open"):
            ours.get("assignment")
        stranger.set(ours.key("assignment"), b"garbage")
        with pytest.raises(PermissionError):
            ours.get("assignment")
    finally:
        del server
    # The store owned the listening socket: nothing listens on its port any more.
    listening = {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert port not in listening


def test_a_sealed_value_copied_under_another_key_is_refused():
    server, port = host_store("127.0.0.1", 10)
    try:
        ours = SealedStore(join_store("127.0.0.1", port, 10), b"s" * 32, "run")
        ours.put("task/0", TaskInfo(0, "h"))
        raw = join_store("127.0.0.1", port, 10)
        raw.set(ours.key("abort"), raw.get(ours.key("task/0")))  # a valid blob, replayed as an abort
        assert ours.has("task/0") and not ours.has("abort")
    finally:
        del server


def test_a_store_bound_to_one_address_is_reached_by_another_name_for_it():
    # spark.driver.bindAddress=127.0.0.1, spark.driver.host=localhost: bind one, ranks dial the other.
    server, port = host_store("127.0.0.1", 10)
    try:
        client = SealedStore(join_store("localhost", port, 10), b"k" * 32, "run")
        client.put("task/0", "here")
        assert SealedStore(server, b"k" * 32, "run").get("task/0") == "here"
    finally:
        del server
