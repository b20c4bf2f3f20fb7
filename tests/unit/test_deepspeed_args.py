"""DeepspeedTorchDistributor without a JVM: what the driver checks before any job, and what a rank makes of the
config (spark_dist/task/deepspeed_args.py): the arguments a script or a function's sys.argv get, the file they
name, and ``ctx.deepspeed_config``."""
import json
import os
import stat
import sys

import pytest

from spark_dist import ConfigError, DeepspeedTorchDistributor, TrainContext
from spark_dist.task import deepspeed_args
from spark_dist.wire.protocol import Job

CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}


def context():
    return TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, attempt=0,
                        run_id="r", host="h")


def noop():
    return None


@pytest.fixture
def argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["worker.py"])


def test_other_jobs_pass_unchanged(tmp_path, argv):
    job, ctx = Job(fn=noop), context()
    assert deepspeed_args.prepare(job, ctx, str(tmp_path)) is job
    assert ctx.deepspeed_config is None and sys.argv == ["worker.py"] and os.listdir(tmp_path) == []


def test_a_dict_reaches_a_script_as_a_private_file_and_the_context(tmp_path):
    ctx = context()
    job = Job(script_path="/x/train.py", script_args=("--lr=1",), deepspeed=True,
              deepspeed_config_text=json.dumps(CONFIG))
    ran = deepspeed_args.prepare(job, ctx, str(tmp_path))
    path = str(tmp_path / deepspeed_args.CONFIG_FILE)
    assert ran.script_args == ("--lr=1", "--deepspeed", "--deepspeed_config", path)
    assert json.loads(open(path).read()) == CONFIG and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ctx.deepspeed_config == CONFIG
    ctx.deepspeed_config["zero_optimization"]["stage"] = 0  # a copy on each read: the rank's stays
    assert ctx.deepspeed_config == CONFIG


def test_a_function_gets_the_arguments_in_sys_argv(tmp_path, argv):
    given = tmp_path / "ds.json"
    given.write_text(json.dumps(CONFIG))
    ctx = context()
    job = Job(fn=noop, deepspeed=True, deepspeed_config_path=str(given), deepspeed_config_text="{}")
    assert deepspeed_args.prepare(job, ctx, str(tmp_path / "work")) is job
    # The path given, where it exists on the rank's host (as PySpark passes it), read there.
    assert sys.argv == ["worker.py", "--deepspeed", "--deepspeed_config", str(given)]
    assert ctx.deepspeed_config == CONFIG


def test_without_a_config_only_the_flag(tmp_path, argv):
    ctx = context()
    deepspeed_args.prepare(Job(fn=noop, deepspeed=True), ctx, str(tmp_path))
    assert sys.argv == ["worker.py", "--deepspeed"] and ctx.deepspeed_config is None


def test_a_path_missing_on_the_rank_gets_the_drivers_copy_or_a_clear_error(tmp_path, argv):
    missing = str(tmp_path / "elsewhere" / "ds.json")
    job = Job(fn=noop, deepspeed=True, deepspeed_config_path=missing, deepspeed_config_text=json.dumps(CONFIG))
    deepspeed_args.prepare(job, context(), str(tmp_path))
    assert sys.argv[-1] == str(tmp_path / deepspeed_args.CONFIG_FILE)
    with pytest.raises(ConfigError, match="deepspeedConfig file .* exists neither on this host"):
        deepspeed_args.prepare(Job(fn=noop, deepspeed=True, deepspeed_config_path=missing), context(), str(tmp_path))


def test_parse_takes_json_or_hjson_objects_only():
    assert deepspeed_args.parse('{"a": 1}', "x") == {"a": 1}
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        deepspeed_args.parse("[1]", "x")
    pytest.importorskip("hjson")
    assert deepspeed_args.parse("{\n  # a comment\n  a: 1\n}", "x") == {"a": 1}


@pytest.mark.parametrize("config, message", [
    (3, "must be a dict, the path of a JSON file or None"),
    ({"a": {1, 2}}, "JSON-serialisable"),
    ("/no/such/ds_config.json", "does not exist"),
])
def test_bad_configs_fail_on_the_driver_before_any_rank_starts(config, message):
    d = DeepspeedTorchDistributor(numGpus=2, localMode=True, useGpu=False, deepspeedConfig=config)
    with pytest.raises(ConfigError, match=message):
        d.run(noop)


def test_a_config_file_that_does_not_parse_fails_on_the_driver(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    d = DeepspeedTorchDistributor(numGpus=1, localMode=True, useGpu=False, deepspeedConfig=str(bad))
    with pytest.raises(ConfigError, match="deepspeedConfig file"):
        d.run(noop)


@pytest.mark.parametrize("kwargs", [{"numGpus": 0}, {"nnodes": -1}, {"numGpus": True}, {"nnodes": 1.5}])
def test_numgpus_and_nnodes_must_be_positive_integers(kwargs):
    # PySpark multiplies them first: numGpus=-1, nnodes=-1 would pass its check as one process.
    with pytest.raises(ConfigError, match="has to be a positive integer"):
        DeepspeedTorchDistributor(useGpu=False, **kwargs)
