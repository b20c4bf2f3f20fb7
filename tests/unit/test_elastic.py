"""spark_dist.driver.elastic: how many ranks an elastic run's next attempt gets, and what its history says.
Spark's slot counts are given as plain functions here; tests/spark/test_two_hosts.py runs it on a cluster. No JVM."""
import time

import pytest

from spark_dist.config import RunConfig
from spark_dist.driver import elastic
from spark_dist.errors import ConfigError, RankFailure


def config(**kwargs):
    return RunConfig.build(num_processes=4, min_processes=2, **kwargs)


def lost(*ranks, host="10.213.0.3"):
    return [RankFailure(r, host, "lost", "host went silent") for r in ranks]


def test_a_retry_takes_every_rank_once_their_slots_are_free():
    assert elastic.retry_size(config(), None, 4, lost(2, 3), wait=5, settle=5, free_slots=lambda: 4) == 4


def test_a_retry_settles_for_the_slots_left_without_waiting_for_lost_executors(monkeypatch):
    import time

    monkeypatch.setattr(elastic, "_RECHECK_S", 0.01)
    free = iter([0, 0, 1, 2])  # the failed attempt's own tasks end first; the lost host's never do
    started = time.monotonic()
    size = elastic.retry_size(config(), None, 4, lost(2, 3), wait=600, settle=5, still=0.1,
                              free_slots=lambda: next(free, 2))
    assert size == 2 and time.monotonic() - started < 2  # once the count stood still, not the whole settle


def test_a_grow_waits_for_its_own_stopped_tasks_to_free_their_slots(monkeypatch):
    monkeypatch.setattr(elastic, "_RECHECK_S", 0.01)
    # The 2 missing ranks' slots were free; the stopped attempt's own 2 tasks end one after the other.
    free = iter([2] * 20 + [3] * 20)
    resized = [RankFailure(0, "h", "resized", "free slots for 2 more ranks: growing to 4")]
    assert elastic.retry_size(config(), None, 2, resized, wait=600, settle=5, still=5,
                              free_slots=lambda: next(free, 4)) == 4


def test_a_retry_below_min_processes_waits_then_names_the_keys(monkeypatch):
    monkeypatch.setattr(elastic, "_RECHECK_S", 0.01)
    with pytest.raises(ConfigError, match=r"slots for 1 ranks, fewer than min_processes=2 \(spark.dist.minProcesses\)"
                                          r", after waiting 0.05s \(spark.dist.retrySlotWaitTimeout\)"):
        elastic.retry_size(config(), None, 4, lost(1, 2, 3), wait=0.05, settle=0, free_slots=lambda: 1)


def test_sizes_are_whole_multi_gpu_tasks():
    gpus = RunConfig.build(num_processes=8, min_processes=4, use_gpu=True,
                           spark_conf={"spark.task.resource.gpu.amount": "2"})
    assert elastic.retry_size(gpus, None, 8, lost(6, 7), wait=1, settle=0, free_slots=lambda: 3) == 6


def test_under_spark_connect_a_retry_leaves_out_the_ranks_lost():
    # No count of free slots: the last attempt's size without its lost ranks, never below min_processes.
    assert elastic.retry_size(config(), None, 4, lost(2, 3), 5, 5, free_slots=lambda: None) == 2
    assert elastic.retry_size(config(), None, 4, lost(1, 2, 3), 5, 5, free_slots=lambda: None) == 2
    raised = [RankFailure(1, "h", "exception", "ValueError")]
    assert elastic.retry_size(config(), None, 2, raised, 5, 5, free_slots=lambda: None) == 4


def test_the_history_names_each_size_and_why():
    c = config()
    assert elastic.resize_record(RunConfig.build(num_processes=4), 0, 4, 0, []) is None  # fixed size: nothing
    assert elastic.resize_record(c, 0, 4, 0, [])["reason"] == "start"
    shrunk = elastic.resize_record(c, 1, 2, 4, lost(2, 3))
    assert (shrunk["event"], shrunk["world_size"], shrunk["reason"], shrunk["rank"]) == (
        "resize", 2, "lost 10.213.0.3", None)
    grown = elastic.resize_record(c, 2, 4, 2, [RankFailure(0, "h", "resized", "free slots for 2 more ranks")])
    assert grown["reason"] == "free slots for 2 more ranks" and grown["attempt"] == 2
    assert elastic.resize_record(c, 3, 4, 4, lost(1)) is None  # a retry at the same size


# -- an elastic run's rank 0 stops at a checkpoint when the driver asks it to resize ---------------------------
class _AskingReporter:
    """The rank's channel to the driver, with the driver's ``resize`` key set (or not)."""

    def __init__(self, reason):
        self.reason, self.records = reason, []

    def __call__(self, record):
        self.records.append(record)

    def resize_reason(self):
        return self.reason


def test_rank_0_stops_once_its_checkpoint_is_written_when_the_driver_asks(tmp_path):
    from spark_dist.task.context import CHECKPOINT_FILE, TrainContext
    from spark_dist.errors import RunResized

    def ctx(rank, reason, watched=True):
        return TrainContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2, node_rank=0, attempt=1,
                            run_id="r", host="h", checkpoint_dir=str(tmp_path), _reporter=_AskingReporter(reason),
                            initial_world_size=4, previous_world_size=4, _watch_resize=watched)

    with pytest.raises(RunResized, match="free slots for 2 more ranks"):
        ctx(0, "free slots for 2 more ranks").save_checkpoint({"step": 7})
    assert (tmp_path / CHECKPOINT_FILE).exists()  # written first: the next attempt resumes from it
    assert ctx(0, "free slots for 2 more ranks").load_checkpoint() == {"step": 7}
    ctx(1, "free slots for 2 more ranks").save_checkpoint({"step": 8})  # other ranks go on (rank 0 decides)
    ctx(0, None).save_checkpoint({"step": 9})  # nothing asked
    ctx(0, "asked", watched=False).save_checkpoint({"step": 10})  # local mode: the driver never asks
    resumed = ctx(0, None)
    assert resumed.resized and resumed.world_size / resumed.initial_world_size == 0.5
    assert not resumed.preempted
    assert not TrainContext(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0, attempt=0,
                            run_id="r", host="h").resized


def test_every_rank_learns_of_a_preemption_and_rank_0_stops_at_its_next_checkpoint(tmp_path):
    import threading

    from spark_dist.task.context import TrainContext
    from spark_dist.errors import RunResized

    reporter = _AskingReporter(None)
    ranks = [TrainContext(rank=r, local_rank=r, world_size=2, local_world_size=2, node_rank=0, attempt=0, run_id="r",
                          host="h", checkpoint_dir=str(tmp_path), _reporter=reporter, _watch_resize=True)
             for r in range(2)]
    heard, called = [], threading.Event()
    ranks[1].on_preemption(lambda why: (heard.append(why), called.set()), every=0.01)
    assert not ranks[1].preempted
    reporter.reason = "preempted: executor 1 on 10.213.0.3 being decommissioned"
    assert called.wait(5) and heard == ["executor 1 on 10.213.0.3 being decommissioned"]
    assert ranks[0].preempted and ranks[1].preempted
    with pytest.raises(RunResized, match="^preempted: executor 1"):
        ranks[0].save_checkpoint({"step": 3})
    elastic_config = config()
    record = elastic.resize_record(elastic_config, 1, 4, 4, [RankFailure(0, "h", "resized", reporter.reason)])
    assert (record["event"], record["world_size"]) == ("preempted", 4)  # a restart at full size is recorded too
    fixed = elastic.resize_record(RunConfig.build(num_processes=2), 1, 2, 2,
                                  [RankFailure(0, "h", "resized", reporter.reason)])
    assert fixed["event"] == "preempted"  # any run's preemption, elastic or not


def test_rank_0_hears_a_preemption_once_even_when_its_checkpoint_stops_it_first(tmp_path):
    from spark_dist.task.context import TrainContext
    from spark_dist.errors import RunResized

    reporter = _AskingReporter(None)
    rank0 = TrainContext(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0, attempt=0, run_id="r",
                         host="h", checkpoint_dir=str(tmp_path), _reporter=reporter, _watch_resize=True)
    heard = []
    rank0.on_preemption(heard.append, every=3600)  # its thread looked once, before the notice, and sleeps
    time.sleep(0.05)
    reporter.reason = "preempted: executor 1 on 10.213.0.3 being decommissioned"
    for _ in range(2):
        with pytest.raises(RunResized):
            rank0.save_checkpoint({"step": 3})
    assert heard == ["executor 1 on 10.213.0.3 being decommissioned"]  # before the stop, and only once


def test_a_grow_waits_for_a_checkpoint_whose_epoch_deals_out_evenly_a_preemption_does_not(tmp_path):
    from spark_dist.task.context import TrainContext
    from spark_dist.errors import RunResized

    def ctx(reason):
        return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=1,
                            run_id="r", host="h", checkpoint_dir=str(tmp_path), _reporter=_AskingReporter(reason),
                            initial_world_size=2, previous_world_size=2, _watch_resize=True)

    # Rank 0 on 1 of 2 ranks, 3 batches into an epoch of 16 (64 rows, batches of 4): 13 left would not deal out
    # evenly to 2 ranks, 12 would.
    at = {"epoch": 0, "batches": 3, "world_size": 1, "num_rows": 64, "batch_size": 4, "drop_last": True}
    ctx("free slots for 1 more rank: growing to 2").save_checkpoint({"loader": at})
    with pytest.raises(RunResized, match="growing"):
        ctx("free slots for 1 more rank: growing to 2").save_checkpoint({"loader": {**at, "batches": 4}})
    with pytest.raises(RunResized, match="^preempted"):
        ctx("preempted: executor 1 on h being decommissioned").save_checkpoint({"loader": at})


def test_a_run_preempted_past_its_budget_fails_naming_the_key_and_the_last_executor():
    from spark_dist.errors import TrainingFailedError

    last = RankFailure(0, "10.213.0.3", "resized", "preempted: executor 7 on 10.213.0.3 being decommissioned")
    budget = RunConfig.build(num_processes=2, spark_conf={"spark.dist.maxPreemptions": "3"})
    error = TrainingFailedError([elastic.too_many_preemptions(budget, [last])], 5, "r")
    assert (error.rank, error.host, error.first.kind) == (0, "10.213.0.3", "lost")
    assert "preempted more than spark.dist.maxPreemptions=3 times; the last: executor 7 on 10.213.0.3" in str(error)
    with pytest.raises(ConfigError, match="spark.dist.maxPreemptions='many' is not a count"):
        RunConfig.build(num_processes=2, spark_conf={"spark.dist.maxPreemptions": "many"})


# -- while an attempt runs: a preemption is ours by executor, a grow backs off after one that fell short -------
def _watching(monkeypatch, gone=None, stage=None, by_task=None, free=None):
    """Spark's answers as elastic.watch reads them through spark_dist.spark.session, all given."""
    from spark_dist.spark import session

    monkeypatch.setattr(session, "is_connect", lambda spark: False)
    monkeypatch.setattr(session, "decommissioning_hosts", lambda spark: dict(gone or {}))
    monkeypatch.setattr(session, "stage_executors", lambda spark, stage_id: stage)
    monkeypatch.setattr(session, "stage_task_executors", lambda spark, stage_id: by_task, raising=False)
    monkeypatch.setattr(session, "free_task_slots", lambda spark: free() if callable(free) else free)


def _tasks():
    from spark_dist.wire.ranks import TaskInfo

    return [TaskInfo(0, "10.0.0.5", (), "10.0.0.5:41001", 0, 12), TaskInfo(1, "10.0.0.6", (), "10.0.0.6:41002", 1, 12)]


def test_a_neighbour_executor_decommissioned_on_our_host_is_not_our_preemption(monkeypatch):
    fixed = RunConfig.build(num_processes=2)
    # Executor 7 shares 10.0.0.5 with our executor 3; the stage's executor summaries are not flushed yet, but
    # the status store has each task's executor since the task started.
    _watching(monkeypatch, gone={"7": "10.0.0.5"}, stage=None, by_task={0: "3", 1: "4"})
    assert elastic.watch(fixed, object(), 2)(_tasks()) is None
    _watching(monkeypatch, gone={"3": "10.0.0.5", "7": "10.0.0.5"}, stage=None, by_task={0: "3", 1: "4"})
    assert elastic.watch(fixed, object(), 2)(_tasks()) == "preempted: executor 3 on 10.0.0.5 being decommissioned"
    # Where the status store can say nothing of the tasks, the hosts decide.
    _watching(monkeypatch, gone={"7": "10.0.0.5"}, stage=None, by_task=None)
    assert elastic.watch(fixed, object(), 2)(_tasks()).startswith("preempted: executor 7")
    _watching(monkeypatch, gone={"7": "10.0.0.5"}, stage=None, by_task={0: "3"})  # task 1 not recorded yet
    assert elastic.watch(fixed, object(), 2)(_tasks()).startswith("preempted: executor 7")


def test_the_status_stores_tasks_name_their_executors():
    from spark_dist.spark import jvm

    class Seq:
        def __init__(self, items):
            self.items = items

        def iterator(self):
            it = iter(self.items)
            box = {"next": next(it, None)}

            class Iterator:
                def hasNext(self):
                    return box["next"] is not None

                def next(self):
                    value, box["next"] = box["next"], next(it, None)
                    return value
            return Iterator()

    class Task:
        def __init__(self, index, executor):
            self._index, self._executor = index, executor

        def index(self):
            return self._index

        def executorId(self):
            return self._executor

    class Store:
        def taskList(self, stage, attempt, most):
            assert (stage, attempt) == (12, 0)
            return Seq([Task(1, "4"), Task(0, "3")])

    class SC:
        def statusStore(self):
            return Store()

    class JSC:
        def sc(self):
            return SC()

    class Context:
        _jsc = JSC()

    assert jvm.stage_task_executors(Context(), 12) == {0: "3", 1: "4"}


def test_a_grow_that_fell_short_backs_off_and_the_grows_have_a_budget(monkeypatch, tmp_path):
    """Slots that flicker: each time the missing ranks' slots show free the attempt stops to grow, and each time
    the next attempt gets only 2 of the 4 ranks. The run stops growing after its budget, not never."""
    import cloudpickle

    from spark_dist.driver import distributor
    from spark_dist.driver.outcome import Outcome

    waits = []

    class Flickering:
        """An attempt on fewer ranks stops to grow when its watch would (a short wait counts as free slots)."""

        def __init__(self, owner, sized, *args):
            self.sized = sized

        def run(self):
            wait = getattr(self.sized, "grow_wait", 0.0)
            waits.append(wait)
            assert len(waits) < 30, "the run kept stopping to grow"
            if self.sized.num_processes < 4 and wait < 1e9:
                return Outcome(failures=[RankFailure(0, "h", "resized", "free slots for 2 more ranks: growing to 4")])
            return Outcome(result_bytes=cloudpickle.dumps("done"))

    monkeypatch.setattr(distributor, "Attempt", Flickering)
    monkeypatch.setattr(distributor.Distributor, "_retry_size", lambda self, *args: 2)
    monkeypatch.setattr(distributor.Distributor, "_slots", lambda self, *args: _no_wait())
    run = distributor.Distributor(num_processes=4, min_processes=2, verbose=False)
    config = RunConfig.build(num_processes=4, min_processes=2, run_id="flicker",
                             spark_conf={"spark.dist.maxShortGrows": "3"})
    assert run._attempts(config, None, None, b"", {}, str(tmp_path), 2) == "done"
    assert waits[:4] == [0.0, elastic.GROW_BACKOFF_S, 2 * elastic.GROW_BACKOFF_S, 4 * elastic.GROW_BACKOFF_S]
    assert len(waits) == 5 and waits[4] == float("inf")  # the budget spent: it goes on at its size
    with pytest.raises(ConfigError, match="spark.dist.maxShortGrows='x' is not a count"):
        RunConfig.build(num_processes=4, min_processes=2, spark_conf={"spark.dist.maxShortGrows": "x"})


def _no_wait():
    import contextlib

    return contextlib.nullcontext(0.0)


def test_a_grow_waits_until_the_missing_slots_stayed_free_for_the_attempts_grow_wait(monkeypatch):
    import dataclasses
    import types

    now = [0.0]
    monkeypatch.setattr(elastic, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=time.time,
                                                               sleep=time.sleep))
    free = iter([2, 2, 1, 2, 2, 2, 2])
    _watching(monkeypatch, free=lambda: next(free))
    attempt = dataclasses.replace(config(), num_processes=2, grow_wait=30.0)
    check = elastic.watch(attempt, object(), 4)
    seen = []
    for t in (0, 20, 25, 30, 50, 59, 61):  # free, free, taken again (the clock restarts), then free from 30 on
        now[0] = float(t)
        seen.append(check(_tasks()))
    assert seen[:6] == [None] * 6 and seen[6] == "free slots for 2 more ranks: growing to 4"
    _watching(monkeypatch, free=2)
    assert elastic.watch(dataclasses.replace(attempt, grow_wait=float("inf")), object(), 4)(_tasks()) is None
