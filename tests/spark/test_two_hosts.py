"""Two hosts (network namespaces, tests/two_hosts.py): what only shows when ranks are on different hosts.

The namespaces resolve the machine's host name to 127.0.0.1, as many containers do; gloo's own choice of
address then breaks its mesh across hosts, which spark_dist avoids by naming the interface of each task's
Spark address.
"""
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from spark_dist import Distributor, get_context


def where_am_i():
    dist.init_process_group("gloo")
    ctx = get_context()
    mine = {key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                   "GROUP_RANK", "MASTER_ADDR", "GLOO_SOCKET_IFNAME")}
    mine["host"] = ctx.host
    ctx.save_checkpoint({"step": 1})  # rank 0, in the run's default checkpoint dir on its own host
    mine["checkpoint"] = (tempfile.gettempdir(), ctx.checkpoint_dir,
                          os.path.exists(os.path.join(ctx.checkpoint_dir, "checkpoint.pt")))
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)  # gloo's full mesh, across the two hosts
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"ranks": everyone, "sum": float(total)}


def test_ranks_on_two_hosts_get_torchrun_variables_and_a_working_gloo_mesh(spark_two_hosts, spark_manager):
    out = Distributor(num_processes=2, verbose=False).run(where_am_i)
    assert out["sum"] == 2.0
    by_rank = sorted(out["ranks"], key=lambda r: int(r["RANK"]))
    assert {r["host"] for r in by_rank} == {"10.213.0.2", "10.213.0.3"}  # one rank per host
    for node, r in enumerate(by_rank):
        assert (r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"], r["GROUP_RANK"]) == (
            str(node), "0", "2", "1", str(node))
        assert r["MASTER_ADDR"] == "10.213.0.1"  # the driver's store, on the driver's address
        assert r["GLOO_SOCKET_IFNAME"] == "eth0"  # the namespace's interface, not loopback
        # The default checkpoint dir: on the rank's own host, in its private temp dir (never a path the driver
        # computed), and removed from each host once the run succeeded (the driver never sees these disks).
        host_tmp, checkpoint_dir, saved = r["checkpoint"]
        assert host_tmp == spark_manager.hosts_cluster.host_tmp[r["host"]]
        assert os.path.dirname(checkpoint_dir) == os.path.join(host_tmp, f"spark_dist-{os.getuid()}")
        assert saved == (node == 0)
        assert not os.path.exists(checkpoint_dir)


def my_labels():
    ctx = get_context()
    dist.init_process_group("gloo")
    labels = sorted(int(v) for batch in ctx.loader("train", batch_size=10, epoch=0) for v in batch["label"])
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, (ctx.host, labels))
    dist.destroy_process_group()
    return everyone


def test_each_host_reads_a_disjoint_equal_shard_of_a_shared_cache(spark_two_hosts, tmp_path):
    from pyspark.sql import functions as F

    from spark_dist.data import CACHE_DIR_CONF, DatasetError, prepare_datasets

    df = spark_two_hosts.range(200).select(F.array(F.col("id").cast("float")).alias("x"),
                                           F.col("id").alias("label"))
    # The default cache dir is on the driver's disk: refused while executors run on other hosts.
    try:
        prepare_datasets(spark_two_hosts, {"train": df}, num_ranks=2)
        raise AssertionError("a driver-local cache was accepted with executors on other hosts")
    except DatasetError as exc:
        assert CACHE_DIR_CONF in str(exc) and "10.213.0.2" in str(exc)
    # A directory the user names is checked by the executors (here every host mounts the same disk).
    spark_two_hosts.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")
    try:
        shards = Distributor(num_processes=2, verbose=False).run(my_labels, datasets={"train": df})
    finally:
        spark_two_hosts.conf.unset(CACHE_DIR_CONF)
    (host_a, a), (host_b, b) = shards
    assert {host_a, host_b} == {"10.213.0.2", "10.213.0.3"}
    assert len(a) == len(b) == 100 and not set(a) & set(b) and sorted(a + b) == list(range(200))


def test_a_named_file_cache_that_the_executors_do_not_see_is_refused(spark_two_hosts, spark_manager):
    from spark_dist.data import CACHE_DIR_CONF, DatasetError, prepare_datasets

    hidden = spark_manager.hosts_cluster.driver_only_dir  # the driver's disk only: not mounted on the hosts
    df = spark_two_hosts.range(20).selectExpr("array(cast(id as float)) as x")
    spark_two_hosts.conf.set(CACHE_DIR_CONF, f"file://{hidden}")
    try:
        with pytest.raises(DatasetError) as info:
            prepare_datasets(spark_two_hosts, {"train": df}, num_ranks=2)
    finally:
        spark_two_hosts.conf.unset(CACHE_DIR_CONF)
    assert str(info.value).startswith(f"{CACHE_DIR_CONF}=file://{hidden}: executors on 10.213.0.2, 10.213.0.3 "
                                      "do not see this directory")
    assert os.listdir(hidden) == []  # refused before the write; the driver's marker file is gone too


def test_a_killed_rank_resumes_across_hosts_with_identical_weights(spark_two_hosts, tmp_path):
    import test_reliability

    test_reliability.test_a_killed_rank_resumes_from_its_checkpoint_with_identical_weights(spark_two_hosts, tmp_path)


def listeners_of_a_rank():
    import psutil

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    mine = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN})
    everyone = [None] * get_context().world_size
    dist.all_gather_object(everyone, (get_context().host, mine))
    dist.destroy_process_group()
    return everyone


def test_no_listener_on_any_address_but_its_own_host(spark_two_hosts):
    import threading

    import psutil

    def listening():
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
                if c.status == psutil.CONN_LISTEN}

    before, seen, done = listening(), set(), threading.Event()

    def watch():  # the driver's own listeners while the run is on (its store); the JVM's are Spark's
        while not done.is_set():
            seen.update(listening() - before)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        ranks = Distributor(num_processes=2, verbose=False).run(listeners_of_a_rank)
    finally:
        done.set()
        watcher.join()
    assert seen and {ip for ip, _ in seen} == {"10.213.0.1"}  # the store: the driver's address only
    for host, ips in ranks:
        assert ips == [host]  # gloo's listeners in each rank: its host's address, never 0.0.0.0


def test_an_elastic_run_goes_on_with_the_host_left_then_grows_back_when_it_returns(spark_two_hosts, spark_manager,
                                                                                    tmp_path):
    # 4 ranks, 2 on each host; one host goes off the network mid-epoch and the run goes on with the 2 ranks of the
    # other, without waiting for it; the host comes back and the run grows to 4 ranks at a checkpoint.
    import threading

    import test_elastic_runs as elastic_runs

    from spark_dist.data import CACHE_DIR_CONF

    cluster, epochs = spark_manager.hosts_cluster, elastic_runs.EPOCHS
    kept, roots = tmp_path / "kept", tmp_path / "checkpoints"
    kept.mkdir()
    spark_two_hosts.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")  # a disk every host sees
    train = elastic_runs.dataset(spark_two_hosts)
    d = Distributor(num_processes=4, min_processes=2, max_retries=1, checkpoint_dir=str(roots), verbose=False)
    times = {}

    def operator():
        elastic_runs.wait_for_report(d, lambda r: r.get("step", 0) >= 3)
        times["down"] = time.time()
        cluster.take_down(1)  # host 10.213.0.3
        elastic_runs.wait_for_report(d, lambda r: r.get("world") == 2)
        times["up"] = time.time()
        cluster.bring_up(1)

    helper = threading.Thread(target=operator, daemon=True)
    helper.start()
    try:
        out = d.run(elastic_runs.elastic_train, epochs, elastic_runs.STEP_S, 0.05, str(kept), fast_from_attempt=2,
                    datasets={"train": train})
        helper.join()
        events = [(r["event"], r["world_size"], r["reason"]) for r in d.history if r.get("event")]
        assert events == [("resize", 4, "start"), ("resize", 2, "lost 10.213.0.3"),
                          ("resize", 4, "free slots for 2 more ranks: growing to 4")], events
        reports = [r for r in d.history if r.get("rank") is not None]
        first = {a: min((r for r in reports if r["attempt"] == a), key=lambda r: r["time"]) for a in (1, 2)}
        detected = times["down"] + 10.0  # spark.dist.hostLostTimeout
        assert first[1]["time"] - detected < 30, f"trained again {first[1]['time'] - detected:.1f}s after"
        assert {r["world"] for r in reports if r["attempt"] == 1} == {2}
        assert {r["world"] for r in reports if r["attempt"] == 2} == {4}
        elastic_runs.assert_every_row_once_per_epoch(d.history, epochs)
        # Fixed-size runs from the checkpoint the elastic run went on from: 2 ranks, at the learning rate the
        # elastic run's 2 ranks had (0.05 * 2 / 4), up to the checkpoint it grew back from, then 4 ranks from
        # that one to the end. The same weights at the grow and at the end, to the bit.
        resumed_from, grown_from = first[1]["step"] - 1, first[2]["step"] - 1
        (roots / "from-checkpoint").mkdir(mode=0o700)
        (kept / f"step-{resumed_from}.pt").rename(roots / "from-checkpoint" / "checkpoint.pt")
        two, four = (Distributor(num_processes=n, checkpoint_dir=str(roots), run_id="from-checkpoint", verbose=False)
                     for n in (2, 4))
        at_grow = two.run(elastic_runs.elastic_train, epochs, 0.0, 0.025, until_step=grown_from,
                          datasets={"train": train})
        grown = torch.load(kept / f"step-{grown_from}.pt")["model"]
        assert at_grow["step"] == grown_from
        assert torch.equal(at_grow["weight"], grown["weight"]) and torch.equal(at_grow["bias"], grown["bias"])
        at_end = four.run(elastic_runs.elastic_train, epochs, 0.0, 0.05, datasets={"train": train})
        assert at_end["step"] == out["step"] == max(r["step"] for r in reports)
        assert torch.equal(at_end["weight"], out["weight"]) and torch.equal(at_end["bias"], out["bias"])
    finally:
        # The host's executor may not outlive its time off the network (Spark 3.5's does not): the next test
        # starts a fresh cluster. Back on the network first, or stopping Spark waits out its RPC timeouts.
        spark_two_hosts.conf.unset(CACHE_DIR_CONF)
        cluster.bring_up(1)
        spark_manager.stop()
        cluster.stop()
        spark_manager.hosts_cluster = None


def train_for_a_while(marker_dir=None):
    dist.init_process_group("gloo")
    for step in range(600):  # ~60 s of steps, far longer than the test waits
        if step == 20 and marker_dir is not None:
            # Two seconds into training: the supervisors' heartbeats have reached the driver (a rank that never
            # beat is given 60 s: its worker may still be importing torch), and the test may take a host down.
            open(os.path.join(marker_dir, f"rank{dist.get_rank()}"), "w").close()
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)
    return "finished"


def test_a_host_taken_off_the_network_is_named_within_the_bound(spark_two_hosts, spark_manager, tmp_path):
    # Last in this file: it breaks the two-host cluster, which is then stopped (a later test starts a new one).
    import threading

    from spark_dist import TrainingFailedError

    cluster, down_at = spark_manager.hosts_cluster, []
    os.chmod(tmp_path, 0o777)  # the ranks' markers

    def take_down_once_both_train():
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        down_at.append(time.monotonic())
        cluster.take_down(1)  # host 10.213.0.3, mid-run: its heartbeats have flowed for a while

    operator = threading.Thread(target=take_down_once_both_train, daemon=True)
    operator.start()
    try:
        try:
            Distributor(num_processes=2, verbose=False).run(train_for_a_while, str(tmp_path))
            raise AssertionError("the run finished although a host was off the network")
        except TrainingFailedError as exc:
            error, took = exc, time.monotonic() - down_at[0] if down_at else None
    finally:
        cluster.bring_up(1)  # else stopping Spark waits out its RPC timeouts for the unreachable executor
        spark_manager.stop()
        cluster.stop()
        spark_manager.hosts_cluster = None
    assert took is not None, f"the run failed before the host was taken down: {error}"
    assert error.first.kind == "lost" and error.host == "10.213.0.3"
    assert "spark.dist.hostLostTimeout" in str(error)
    lost = [f for f in error.failures.values() if f.kind == "lost"]
    assert [f.host for f in lost] == ["10.213.0.3"]  # every rank on that host (here: one) and no other
    # spark.dist.hostLostTimeout (10 s), then the abort: well before Spark's own executor timeout (60-120 s).
    assert took < 30, f"the lost host was reported {took:.1f} s after its link went down"
