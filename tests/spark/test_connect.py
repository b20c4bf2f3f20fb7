"""Spark Connect: every entry point from a remote ``sc://`` session (tests/connect_server.py runs the server).

The client holds no SparkContext: the launch is a barrier ``mapInArrow`` job under a job tag, the run's
store lives in the first task, and datasets are written through the DataFrame API.
"""
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from spark_dist import ConfigError, Distributor, TrainingFailedError, get_context


def allreduce_and_describe(scale):
    dist.init_process_group("gloo")
    ctx = get_context()
    t = torch.tensor([float(ctx.rank + 1) * scale])
    dist.all_reduce(t)
    ctx.report(step=1, value=float(t))
    dist.destroy_process_group()
    return {"sum": float(t), "world": ctx.world_size, "store": os.environ["MASTER_ADDR"]}


def test_a_function_runs_on_two_ranks_through_connect(spark_connect):
    from pyspark.sql import SparkSession
    from pyspark.sql.utils import is_remote

    # The run finds the session as a user's code would: is_remote(), then the active session.
    assert is_remote() and not hasattr(spark_connect, "_jsc") and SparkSession.getActiveSession() is spark_connect
    d = Distributor(num_processes=2, verbose=False)
    assert d.run(allreduce_and_describe, 1.0) == {"sum": 3.0, "world": 2, "store": "127.0.0.1"}
    assert sorted(r["rank"] for r in d.history) == [0, 1]  # the reports come back with the result


def test_a_script_runs_through_connect(spark_connect, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, sys\nimport torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\nt = torch.ones(1)\ndist.all_reduce(t)\n"
                      "open(sys.argv[1] + '/rank' + os.environ['RANK'], 'w').write(str(float(t)))\n")
    # The user's own job description is theirs: the run neither replaces nor unsets it.
    spark_connect.conf.set("spark.job.description", "my nightly training")
    try:
        assert Distributor(num_processes=2, verbose=False).run(str(script), str(tmp_path)) is None
        assert spark_connect.conf.get("spark.job.description") == "my nightly training"
    finally:
        spark_connect.conf.unset("spark.job.description")
    assert sorted(p.read_text() for p in tmp_path.glob("rank*")) == ["2.0", "2.0"]


def raise_on_rank_one():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if get_context().rank == 1:
        raise KeyError("no such column on rank 1")
    dist.barrier()


def test_a_failing_rank_is_named_with_its_exception(spark_connect):
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, verbose=False).run(raise_on_rank_one)
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert isinstance(info.value.cause, KeyError) and "raise_on_rank_one" in info.value.remote_traceback


def plans_executed(spark, monkeypatch):
    """A list that grows by one for each plan or command this Connect client sends the server to execute (every
    job a client starts is one; settings and schemas go by other calls)."""
    client, sent = spark.client, []
    make_request = client._execute_plan_request_with_metadata  # every ExecutePlanRequest the client builds

    def counted(*args, **kwargs):
        sent.append(1)
        return make_request(*args, **kwargs)

    monkeypatch.setattr(client, "_execute_plan_request_with_metadata", counted)
    return sent


def test_bad_settings_fail_before_any_job(spark_connect, monkeypatch):
    sent = plans_executed(spark_connect, monkeypatch)
    spark_connect.range(2).count()
    assert len(sent) == 1  # it counts what a job takes
    # local[2] behind the server: two slots, read from the conf (Connect has no slot API).
    with pytest.raises(ConfigError, match="num_processes=3 but the cluster has 2 task slots"):
        Distributor(num_processes=3, verbose=False).run(allreduce_and_describe, 1.0)
    with pytest.raises(ConfigError, match="backend"):
        Distributor(num_processes=2, backend="mpi")
    assert len(sent) == 1  # nothing executed on the server for either


def test_a_killed_rank_resumes_from_its_checkpoint_with_identical_weights(spark_connect, tmp_path):
    from test_reliability import train_with_checkpoints

    expected = Distributor(num_processes=2, verbose=False, checkpoint_dir=str(tmp_path / "clean")).run(
        train_with_checkpoints, 6, None)
    resumed = Distributor(num_processes=2, max_retries=1, verbose=False, checkpoint_dir=str(tmp_path / "crash"))
    out = resumed.run(train_with_checkpoints, 6, 3)
    assert out["attempt"] == 1 and out["started_at"] == 3 and expected["attempt"] == 0
    assert out["weights"].equal(expected["weights"])


UNPICKLED = []


def _unpickled():
    UNPICKLED.append(1)
    return "unpickled"


class RecordsItsUnpickling:
    def __reduce__(self):
        return _unpickled, ()


def test_the_first_tasks_verdict_is_read_only_under_the_attempts_secret():
    """Under Connect the first task fails the stage on purpose with what it saw (its verdict) in the error text,
    which anyone who can see the Spark UI or raise an error of their own can write: the client unpickles one
    only when it came from the attempt's secret (docs/security.md). No JVM: the text as the client receives it."""
    import base64

    from spark_dist.driver.first_task import VERDICT, FirstTaskReport, verdict, verdict_in

    secret, other = os.urandom(32), os.urandom(32)
    watched = FirstTaskReport(seen=RecordsItsUnpickling(), reports=({"rank": 0, "step": 1},))
    text = f"org.apache.spark.SparkException: Job aborted: Python worker failed: {verdict(watched, secret)} (end)"
    del UNPICKLED[:]
    opened = verdict_in(text, secret)  # the real one: read, and unpickled (which the record below sees)
    assert opened is not None and opened.reports == watched.reports and UNPICKLED == [1]

    del UNPICKLED[:]
    assert verdict_in(verdict(watched, other), secret) is None  # another secret's (another attempt's, a forger's)
    start, end = text.index("<") + 1, text.index(">")
    payload = text[start:end]
    middle = len(payload) // 2
    flipped = "B" if payload[middle] == "A" else "A"
    tampered = text[:start + middle] + flipped + text[start + middle + 1:]
    assert verdict_in(tampered, secret) is None  # one character of it changed
    unsigned = f"{VERDICT}<{base64.b64encode(b'x' * 64).decode()}>"
    assert verdict_in(unsigned, secret) is None and verdict_in("no verdict here", secret) is None
    assert UNPICKLED == []  # none of those was ever unpickled


def test_a_hung_rank_is_named_after_the_timeout(spark_connect):
    from spark_dist import RunTimeoutError
    from test_reliability import hang_on_rank_one, stop_bound

    started = time.monotonic()
    with pytest.raises(RunTimeoutError) as info:
        Distributor(num_processes=2, timeout=8, verbose=False).run(hang_on_rank_one)
    assert info.value.rank == 1 and "hang_on_rank_one" in info.value.remote_traceback
    assert time.monotonic() - started < stop_bound(8) + 10  # and the stage's end through the Connect server


def labels_of_my_shard():
    ctx = get_context()
    seen = []
    for batch in ctx.loader("train", batch_size=25, shuffle=False):
        seen += batch["label"].tolist()
    return seen


def gather_labels():
    dist.init_process_group("gloo")
    mine = labels_of_my_shard()
    everyone = [None, None]
    dist.all_gather_object(everyone, mine)
    return everyone


def test_a_dataframe_is_cached_through_the_dataframe_api_and_sharded(spark_connect):
    from pyspark.sql import functions as F

    from spark_dist.data import DatasetError

    df = spark_connect.range(200).select(F.array(F.col("id").cast("float")).alias("x"), F.col("id").alias("label"))
    a, b = Distributor(num_processes=2, verbose=False).run(gather_labels, datasets={"train": df})
    assert len(a) == len(b) == 100 and not set(a) & set(b) and sorted(a + b) == list(range(200))
    bad = spark_connect.range(10).select(F.create_map(F.lit("k"), F.col("id")).alias("tags"))
    with pytest.raises(DatasetError, match="column 'tags' has type map<string,bigint>"):
        Distributor(num_processes=2, verbose=False).run(gather_labels, datasets={"train": bad})


def test_torch_distributor_and_horovod_runner_drop_ins(spark_connect):
    from spark_dist import HorovodRunner, TorchDistributor

    assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(allreduce_and_describe, 2.0)[
        "sum"] == 6.0
    pytest.importorskip("horovod.torch")
    assert HorovodRunner(np=2, driver_log_verbosity="log_callback_only").run(horovod_sum) == 3.0
    assert Distributor(num_processes=2, backend="horovod", verbose=False).run(horovod_sum) == 3.0


def horovod_sum():
    import horovod.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    hvd.shutdown()
    return float(total)


def test_estimator_fit_and_transform_in_a_pipeline_and_its_model_saved_and_loaded(spark_connect, tmp_path):
    from pyspark.ml import PipelineModel

    from test_ml import accuracy, digits_pandas, digits_pipeline, predictions

    train, test = spark_connect.createDataFrame(digits_pandas()).randomSplit([0.8, 0.2], seed=42)
    pipeline, _ = digits_pipeline("ddp")
    fitted = pipeline.fit(train)
    model = fitted.stages[-1]
    assert accuracy(fitted.transform(test)) >= 0.93
    assert len(model.history) == 10 and model.history[-1]["train_loss"] < model.history[0]["train_loss"]
    saved = predictions(fitted.transform(test))
    path = str(tmp_path / "pipeline_model")
    fitted.write().save(path)
    assert predictions(PipelineModel.load(path).transform(test)) == saved  # exactly the same numbers
    fitted.write().overwrite().save(path)
    assert predictions(PipelineModel.load(path).transform(test)) == saved


# -- the same through a Connect server in front of the standalone cluster: ranks on two executors -----------
def test_standalone_functions_datasets_and_drop_ins(spark_connect_standalone):
    assert Distributor(num_processes=2, verbose=False).run(allreduce_and_describe, 1.0)["sum"] == 3.0
    test_a_dataframe_is_cached_through_the_dataframe_api_and_sharded(spark_connect_standalone)
    test_torch_distributor_and_horovod_runner_drop_ins(spark_connect_standalone)


def test_standalone_failures_and_retries(spark_connect_standalone, tmp_path):
    test_a_failing_rank_is_named_with_its_exception(spark_connect_standalone)
    test_a_killed_rank_resumes_from_its_checkpoint_with_identical_weights(spark_connect_standalone, tmp_path)


def test_standalone_estimator(spark_connect_standalone, tmp_path):
    test_estimator_fit_and_transform_in_a_pipeline_and_its_model_saved_and_loaded(spark_connect_standalone, tmp_path)


def test_what_the_ranks_print_comes_back_with_the_result(spark_connect):
    import contextlib
    import io

    from test_output_runs import lines_of, print_lines

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert Distributor(num_processes=2, verbose=False, log_ranks="all").run(print_lines, 1000) == 0
    for rank in (0, 1):
        assert lines_of(out.getvalue(), rank) == [f"line {i} of rank {rank}" for i in range(1000)]
        assert f"to stderr from rank {rank}" in lines_of(err.getvalue(), rank)


def test_interrupting_the_runs_tag_ends_it_without_a_retry(spark_connect, tmp_path):
    import threading

    from test_launcher import record_pid_and_wait

    def interrupt_when_both_ranks_run():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        spark_connect.interruptTag("spark_dist-tagged-0")  # the run's tag: spark_dist-<run_id>-<attempt>

    threading.Thread(target=interrupt_when_both_ranks_run, daemon=True).start()
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, max_retries=2, verbose=False, run_id="tagged").run(
            record_pid_and_wait, str(tmp_path))
    assert info.value.first.kind == "cancelled" and info.value.attempts == 1
