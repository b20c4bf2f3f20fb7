"""spark_dist.tune and concurrent runs on real Spark: more trials than slots run as many at once as the slots
allow, a failed trial is recorded while the study goes on, a pruned trial's ranks are stopped and its slots freed for the next in warm workers,
runs started from threads wait their turn for slots, on local[2], the standalone cluster and Spark Connect."""
import glob
import os
import threading
import time

import pytest

from clusters import still_running_after
from spark_dist import Distributor, get_context
from spark_dist.tune import optimize

optuna = pytest.importorskip("optuna")


def timed_trial(x, log_dir, hold=1.0):
    """Records when it ran (and which cache it read); fails for x == 3; returns x squared (rank 0's). Each of
    the first two trials to start waits for the other to start too (60 s at most) before its ``hold``: whether
    two run at once then depends on the slots, not on how fast this machine launches them."""
    ctx = get_context()
    start = time.time()
    meet_at_once(log_dir, f"x{x}-rank{ctx.rank}", 2)
    rows = sum(len(batch["v"]) for batch in ctx.loader("points", batch_size=8, drop_last=False)) \
        if "points" in ctx.datasets else 0
    time.sleep(hold)
    cache = ctx.datasets["points"].cache_dir_url if "points" in ctx.datasets else ""
    with open(os.path.join(log_dir, f"x{x}-rank{ctx.rank}"), "w") as f:
        f.write(f"{start} {time.time()} {rows} {cache}")
    if x == 3:
        raise RuntimeError("diverged at x=3")
    ctx.report(epoch=0, loss=float(x * x))
    return float(x * x) + ctx.rank


def meet_at_once(log_dir, me, count, timeout=60.0):
    """Mark ``me`` as started; if fewer than ``count`` had started, wait until ``count`` have (or ``timeout``)."""
    starts = os.path.join(log_dir, "starts")
    os.makedirs(starts, exist_ok=True)
    open(os.path.join(starts, me), "w").close()
    if len(os.listdir(starts)) > count:
        return
    deadline = time.monotonic() + timeout
    while len(os.listdir(starts)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def intervals(log_dir):
    out = []
    for name in os.listdir(log_dir):
        if name == "starts":
            continue
        start, end, rows, cache = (open(os.path.join(log_dir, name)).read().split(" ") + [""])[:4]
        out.append((float(start), float(end), int(rows), cache))
    return out


def most_at_once(spans):
    events = sorted([(s, 1) for s, *_ in spans] + [(e, -1) for _, e, *_ in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def grid(*xs):
    study = optuna.create_study()
    for x in xs:
        study.enqueue_trial({"x": x})
    return study


def objective(log_dir, hold=1.0):
    return lambda trial: (timed_trial, (trial.suggest_int("x", 0, 9), str(log_dir), hold))


def test_more_trials_than_slots_share_local_slots_and_one_cache(spark_local, tmp_path):
    points = spark_local.range(0, 64).selectExpr("cast(id as float) as v")
    study = grid(1, 2, 3, 4, 5)
    optimize(study, objective(tmp_path), 5, datasets={"points": points})  # 1-rank trials on 2 slots
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert [t.value for t in trials if t.value is not None] == [1.0, 4.0, 16.0, 25.0]  # rank 0's returns
    assert "diverged at x=3" in trials[2].user_attrs["error"] and "rank 0" in trials[2].user_attrs["error"]
    spans = intervals(tmp_path)
    assert most_at_once(spans) == 2  # two at once, never more than the slots
    assert {rows for _, _, rows, _ in spans} == {64} and len({cache for *_, cache in spans}) == 1  # one write
    assert spark_local.sparkContext.statusTracker().getActiveJobsIds() == []


def report_then_hang(x, pid_dir):
    ctx = get_context()
    # Each rank leaves its Python worker's pid (a rank is forked from its task's worker) and its own; rank 0
    # reports only once every rank has, so that a trial pruned at its first report had all its ranks up.
    open(os.path.join(pid_dir, f"x{x}-rank{ctx.rank}.worker"), "w").write(str(os.getppid()))
    open(os.path.join(pid_dir, f"x{x}-rank{ctx.rank}.pid"), "w").write(str(os.getpid()))
    while len(glob.glob(os.path.join(pid_dir, f"x{x}-rank*.pid"))) < ctx.world_size:
        time.sleep(0.01)
    for epoch in range(3):
        ctx.report(epoch=epoch, loss=float(x))
        if x > 10:
            time.sleep(600)  # a bad trial the pruner must stop
        time.sleep(0.5)
    return float(x)


def test_a_pruned_trials_ranks_are_stopped_and_its_slots_freed_for_the_next_in_warm_workers(spark_local, tmp_path):
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=10.0))
    for x in (50, 1, 2):
        study.enqueue_trial({"x": x})
    started = time.monotonic()
    optimize(study, lambda t: (report_then_hang, (t.suggest_int("x", 0, 100), str(tmp_path))), 3,
             num_processes=2, metric="loss")  # 2-rank trials on 2 slots: one at a time
    assert time.monotonic() - started < 120
    pruned, *done = sorted(study.trials, key=lambda t: t.number)
    assert pruned.state.name == "PRUNED" and pruned.intermediate_values == {0: 50.0}
    assert [(t.state.name, t.value) for t in done] == [("COMPLETE", 1.0), ("COMPLETE", 2.0)]
    pids = [int(p.read_text()) for p in tmp_path.glob("x50-rank*.pid")]
    assert len(pids) == 2 and still_running_after(pids) == []
    # The pruned trial's ranks were stopped through its store and its lane's tasks went on serving (a cancelled
    # job would have killed them with their Python workers): the next trials' ranks were forked from the same,
    # warm, workers, all three trials served by one barrier job, which ended with the study.
    sc = spark_local.sparkContext
    [lane] = {t.user_attrs["spark_dist_lane"] for t in study.trials}
    [job] = sc.statusTracker().getJobIdsForGroup(lane)
    assert sc.statusTracker().getJobInfo(job).status == "SUCCEEDED"
    assert sc.statusTracker().getActiveJobsIds() == []
    workers = {x: {p.read_text() for p in tmp_path.glob(f"x{x}-rank*.worker")} for x in (50, 1)}
    assert len(workers[50]) == 2 and workers[1] == workers[50]


def hold_slots(i, log_dir):
    start = time.time()
    time.sleep(3)
    with open(os.path.join(log_dir, f"run{i}-rank{get_context().rank}"), "w") as f:
        f.write(f"{start} {time.time()} 0")
    return i


def test_runs_from_threads_wait_their_turn_for_slots_and_fail_none(spark_local, tmp_path):
    # Each run takes both slots for 3 s; the rendezvous timeout is shorter than the wait of the last one, so a
    # job submitted before its slots were free would fail it.
    spark_local.conf.set("spark.dist.rendezvousTimeout", "4s")
    results, errors = {}, []

    def run(i):
        try:
            results[i] = Distributor(num_processes=2, verbose=False).run(hold_slots, i, str(tmp_path))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        spark_local.conf.unset("spark.dist.rendezvousTimeout")
    assert errors == [] and results == {0: 0, 1: 1, 2: 2}
    assert most_at_once(intervals(tmp_path)) == 2  # the two ranks of one run at a time


def test_trials_on_the_standalone_cluster(spark_standalone, tmp_path):
    study = grid(2, 3, 4)
    optimize(study, objective(tmp_path), 3)  # two 1-core executors: two 1-rank trials at once
    assert sorted((t.state.name, t.value) for t in study.trials) == [
        ("COMPLETE", 4.0), ("COMPLETE", 16.0), ("FAIL", None)]
    assert most_at_once(intervals(tmp_path)) == 2


def test_trials_under_spark_connect(spark_connect, tmp_path):
    study = grid(1, 3, 2)
    optimize(study, objective(tmp_path), 3, metric="loss")
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [(t.state.name, t.value) for t in trials] == [("COMPLETE", 1.0), ("FAIL", None), ("COMPLETE", 4.0)]
    assert trials[0].intermediate_values == {0: 1.0}  # rank 0's report, relayed with the job's end
    assert "diverged at x=3" in trials[1].user_attrs["error"]
    assert most_at_once(intervals(tmp_path)) == 2


def hang(x, pid_dir):
    open(os.path.join(pid_dir, f"x{x}-rank{get_context().rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)


def test_ctrl_c_cancels_the_running_trials_jobs(spark_local, tmp_path):
    from spark_jobs import interrupt_main_when

    study = grid(1, 2)
    started = time.monotonic()
    with interrupt_main_when(tmp_path, "*.pid", 2, timeout=90) as ctrl_c:  # once both trials' ranks run
        with pytest.raises(KeyboardInterrupt):
            optimize(study, lambda t: (hang, (t.suggest_int("x", 0, 9), str(tmp_path))), 4)
    assert ctrl_c.fired
    assert time.monotonic() - started < 120
    assert sorted(t.state.name for t in study.trials) == ["FAIL", "FAIL"]  # no new trial after the interrupt
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2 and still_running_after(pids) == []
    assert spark_local.sparkContext.statusTracker().getActiveJobsIds() == []


def gpu_trial(x, log_dir):
    ctx = get_context()
    start = time.time()
    meet_at_once(log_dir, f"x{x}-rank{ctx.rank}", 2)
    time.sleep(1.0)
    with open(os.path.join(log_dir, f"x{x}-rank{ctx.rank}"), "w") as f:
        f.write(f"{start} {time.time()} 0")
    return float(ctx.gpus[0])  # the (fake) GPU this trial's rank was given


def test_gpu_trials_each_get_their_own_gpu(spark_local_cluster, tmp_path):
    study = grid(1, 2)  # two executors with one GPU each, one GPU per task: two 1-GPU trials at once
    optimize(study, lambda t: (gpu_trial, (t.suggest_int("x", 0, 9), str(tmp_path))), 2, use_gpu=True)
    assert sorted(t.value for t in study.trials) == [0.0, 1.0]  # GPU "0" of one executor, "1" of the other
    assert most_at_once(intervals(tmp_path)) == 2
