"""PySpark's DeepspeedTorchDistributor and spark_dist's drop-in, side by side: signature, defaults, attributes,
errors, and what a function's ``sys.argv`` and a script's arguments hold (``--deepspeed --deepspeed_config
FILE``), asserted alike for both classes against the installed pyspark. Where we differ on purpose the test says
so (and docs/deepspeed.md). Then DeepSpeed itself, where it is installed: ZeRO stages 2 and 3 on 2 CPU ranks
(gloo), resuming from DeepSpeed's own checkpoint: as a function through the drop-in (a retry), and as a script
through both classes.
"""
import importlib.util
import inspect
import json
import os
import sys

import pytest
from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor as PySparkDeepspeedDistributor
from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor

from spark_dist import DeepspeedTorchDistributor, TorchDistributor

CLASSES = [pytest.param(PySparkDeepspeedDistributor, id="pyspark"),
           pytest.param(DeepspeedTorchDistributor, id="spark_dist")]
SSL_KEY = "deepspeed.spark.distributor.ignoreSsl"
CONFIG = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (the lock files pin it)")


def argv_view(tag=None):
    """What a rank's function was given: its arguments (the config's path as FILE), the file's content, and
    spark_dist's ``ctx.deepspeed_config`` where there is one."""
    import json
    import os
    import sys

    args = sys.argv[1:]
    config = None
    if "--deepspeed_config" in args:
        at = args.index("--deepspeed_config") + 1
        with open(args[at]) as f:
            config = json.load(f)
        args = args[:at] + ["FILE"] + args[at + 1:]
    try:
        import spark_dist

        from_context = spark_dist.get_context().deepspeed_config
    except RuntimeError:  # PySpark's ranks: no spark_dist run
        from_context = "no context"
    return {"args": args, "config": config, "context": from_context, "rank": os.environ["RANK"], "tag": tag}


def test_signature_and_defaults():
    ours = inspect.signature(DeepspeedTorchDistributor).parameters
    theirs = inspect.signature(PySparkDeepspeedDistributor).parameters
    assert [(p.name, p.default) for p in theirs.values()] == [
        ("numGpus", 1), ("nnodes", 1), ("localMode", True), ("useGpu", True), ("deepspeedConfig", None)]
    # spark_dist's further Distributor options (max_retries, timeout, ...) follow as keywords.
    assert [(p.name, p.default) for p in ours.values()][:5] == [(p.name, p.default) for p in theirs.values()]
    assert list(ours)[5:] == ["options"]
    assert issubclass(PySparkDeepspeedDistributor, PySparkTorchDistributor)
    assert issubclass(DeepspeedTorchDistributor, TorchDistributor)


@pytest.mark.parametrize("cls", CLASSES)
def test_public_attributes_and_constructor_errors(spark_local, cls):
    d = cls(numGpus=2, nnodes=1, localMode=False, useGpu=False, deepspeedConfig=CONFIG)
    assert (d.num_processes, d.local_mode, d.use_gpu, d.num_tasks) == (2, False, False, 2)
    assert d.deepspeed_config is CONFIG and d.cleanup_deepspeed_conf is False
    assert d.ssl_conf == SSL_KEY == cls._DEEPSPEED_SSL_CONF and d.spark is spark_local
    assert d.input_params == {"deepspeed_config": CONFIG, "num_processes": 2, "local_mode": False,
                              "use_gpu": False, "num_tasks": 2}
    assert cls(numGpus=3, nnodes=2, localMode=False, useGpu=False).num_processes == 6  # numGpus * nnodes
    with pytest.raises(ValueError, match="positive"):
        cls(numGpus=0, useGpu=False)
    # The defaults ask for a GPU on the driver; a task run asks for GPU scheduling.
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver"):
        cls()
    with pytest.raises(RuntimeError, match="'spark.task.resource.gpu.amount' was unset"):
        cls(numGpus=2, localMode=False)


@pytest.mark.parametrize("cls", CLASSES)
def test_a_function_gets_the_config_in_its_argv(spark_local, cls, tmp_path):
    out = cls(numGpus=2, localMode=True, useGpu=False, deepspeedConfig=CONFIG).run(argv_view, tag="t")
    assert (out["args"], out["config"], out["tag"]) == (["--deepspeed", "--deepspeed_config", "FILE"], CONFIG, "t")
    # Without a config, "--deepspeed" alone: DeepSpeed falls back to its defaults.
    bare = cls(numGpus=2, localMode=True, useGpu=False).run(argv_view)
    assert (bare["args"], bare["config"]) == (["--deepspeed"], None)
    # Beyond PySpark (whose functions get sys.argv only): the config itself through get_context().
    # And rank 0's value: PySpark's local mode returns whichever rank wrote its output file last.
    if cls is DeepspeedTorchDistributor:
        assert (out["context"], bare["context"], out["rank"]) == (CONFIG, None, "0")
    # A script takes no keyword arguments.
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    with pytest.raises(ValueError, match="keyword"):
        cls(numGpus=2, localMode=True, useGpu=False).run(str(script), lr=0.1)


@pytest.mark.parametrize("cls", CLASSES)
def test_a_script_on_tasks_gets_the_config_path_and_the_ssl_opt_out_is_deepspeeds(runtime_conf, cls, tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(CONFIG))
    script = tmp_path / "train.py"
    script.write_text("import json, os, sys\n"
                      "open(os.path.join(os.path.dirname(__file__), 'rank' + os.environ['RANK']), 'w')"
                      ".write(json.dumps(sys.argv[1:]))\n")
    runtime_conf("spark.ssl.enabled", "true")
    with pytest.raises(RuntimeError, match="encryption"):
        cls(numGpus=2, localMode=False, useGpu=False, deepspeedConfig=str(config)).run(str(script), "--lr=0.1")
    runtime_conf(SSL_KEY, "true")  # set at run time, as a notebook would
    d = cls(numGpus=2, localMode=False, useGpu=False, deepspeedConfig=str(config))
    assert d.run(str(script), "--lr=0.1") is None
    expected = ["--lr=0.1", "--deepspeed", "--deepspeed_config", str(config)]
    assert [json.loads((tmp_path / f"rank{r}").read_text()) for r in (0, 1)] == [expected, expected]


# -- DeepSpeed itself ------------------------------------------------------------------------------------------
def zero_config(stage):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
            "zero_optimization": {"stage": stage}}


@needs_deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_trains_on_cpu_ranks_and_a_retry_resumes_from_its_checkpoint(spark_local, stage, tmp_path):
    sys.path.insert(0, SCRIPTS)
    from train_deepspeed import train

    # Rank 1 of the first attempt dies after step 6; the retry loads DeepSpeed's checkpoint of step 4 from
    # the run's checkpoint directory and trains steps 5 and 6 again: the same losses, to the bit.
    d = DeepspeedTorchDistributor(numGpus=2, localMode=False, useGpu=False, deepspeedConfig=zero_config(stage),
                                  max_retries=1, verbose=False)
    out = d.run(train, record_dir=str(tmp_path), steps=8, save_at=4, fail_at=6)
    first = {int(k): v for k, v in json.loads((tmp_path / "attempt0.json").read_text()).items()}
    assert (out["stage"], out["attempt"], out["start"]) == (stage, 1, 4)
    assert sorted(out["losses"]) == [4, 5, 6, 7] and sorted(first) == [0, 1, 2, 3, 4, 5]
    assert [out["losses"][s] for s in (4, 5)] == [first[4], first[5]]


@needs_deepspeed
@pytest.mark.parametrize("cls", CLASSES)
def test_a_zero3_script_trains_and_resumes_from_its_checkpoint(spark_local, cls, tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(zero_config(3)))
    d = cls(numGpus=2, localMode=True, useGpu=False, deepspeedConfig=str(config))
    d.run(os.path.join(SCRIPTS, "train_deepspeed.py"), "--checkpoint_dir", str(tmp_path / "ckpt"),
          "--record_dir", str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["argv"][-3:] == ["--deepspeed", "--deepspeed_config", str(config)]
    first, resumed = result["first"], result["resumed"]
    assert (first["stage"], first["start"], resumed["stage"], resumed["start"]) == (3, 0, 3, 4)
    assert resumed["losses"] == {k: first["losses"][k] for k in ("4", "5")}
