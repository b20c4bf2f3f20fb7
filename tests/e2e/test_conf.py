"""The conf/ templates: the GPU discovery script, the spark-defaults files and log4j2.properties.

The session checks run in a subprocess (tests/scripts/conf_probe.py): driver JVM options such as the
log4j2 file only take effect in a JVM started with them, and this test process may already hold one.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from commands import REPO, SCRIPTS, run_command

CONF = os.path.join(REPO, "conf")
DISCOVERY = os.path.join(CONF, "gpu_discovery.sh")
LOCAL = os.path.join(CONF, "spark-defaults.local.conf")
GPU_TEMPLATES = [os.path.join(CONF, f"spark-defaults.gpu-{kind}.conf") for kind in ("standalone", "yarn", "k8s")]
LOG4J = os.path.join(CONF, "log4j2.properties")


def read_properties(path):
    from spark_dist.cli.commands import read_properties as parse

    return parse(path)


# ---------------------------------------------------------------------------------------------- discovery
def fake_nvidia_smi(bin_dir, body):
    """An executable ``nvidia-smi`` in bin_dir; it checks it was asked for indices as CSV."""
    path = os.path.join(bin_dir, "nvidia-smi")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                '[ "$*" = "--query-gpu=index --format=csv,noheader" ] || { echo "unexpected args: $*" >&2; exit 9; }\n'
                + body)
    os.chmod(path, 0o755)


def discover(bin_dir):
    # PATH holds only bin_dir: no real nvidia-smi (a GPU machine has one) can answer instead.
    return subprocess.run(["/bin/bash", DISCOVERY], env={"PATH": str(bin_dir)}, capture_output=True,
                          text=True, timeout=30)


def test_discovery_script_is_executable():
    # Spark runs the script directly, not through a shell.
    assert os.access(DISCOVERY, os.X_OK)


def test_discovery_lists_every_gpu_as_spark_json(tmp_path):
    fake_nvidia_smi(tmp_path, 'printf "0\\n1\\n"\n')
    result = discover(tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": "gpu", "addresses": ["0", "1"]}
    assert result.stdout.count("\n") == 1  # Spark reads one JSON document


def test_discovery_fails_clearly_without_nvidia_smi(tmp_path):
    result = discover(tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    assert "nvidia-smi not found on PATH" in result.stderr


@pytest.mark.parametrize("body, message", [
    ('echo "No devices were found"\nexit 6\n', "failed (exit 6): No devices were found"),
    ("exit 0\n", "lists no GPU"),
    ('echo "GPU 0: NVIDIA H100"\n', "unexpected nvidia-smi output line"),
])
def test_discovery_fails_clearly_when_no_gpu_is_listed(tmp_path, body, message):
    fake_nvidia_smi(tmp_path, body)
    result = discover(tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    assert message in result.stderr


# ---------------------------------------------------------------------------------------------- templates
def test_properties_parser_follows_java_properties_rules(tmp_path):
    path = tmp_path / "p.conf"
    path.write_text("# comment\n! also a comment\n\nspark.a   1\nspark.b=2\nspark.c:3\n"
                    "spark.d\t-Dx=y -Dz=w\n")
    assert read_properties(str(path)) == {"spark.a": "1", "spark.b": "2", "spark.c": "3",
                                          "spark.d": "-Dx=y -Dz=w"}


@pytest.mark.parametrize("path", [LOCAL, *GPU_TEMPLATES])
def test_template_parses_as_key_value_lines(path):
    props = read_properties(path)
    assert props, path
    for key, value in props.items():
        assert re.fullmatch(r"spark\.[A-Za-z0-9_.]+", key), key
        assert value and "#" not in value, f"{key}: a trailing comment would become part of the value"
    assert props["spark.dynamicAllocation.enabled"] == "false"
    assert props["spark.locality.wait"] == "0s"
    assert "spark.scheduler.barrier.maxConcurrentTasksCheck.interval" in props
    assert int(props["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"]) > 0


@pytest.mark.parametrize("path", GPU_TEMPLATES)
def test_gpu_template_names_consistent_gpu_keys(path):
    props = read_properties(path)
    executor_gpus = int(props["spark.executor.resource.gpu.amount"])
    task_gpus = int(props["spark.task.resource.gpu.amount"])
    assert task_gpus == 1  # one GPU per rank, which --use-gpu assumes
    assert os.path.basename(props["spark.executor.resource.gpu.discoveryScript"]) == "gpu_discovery.sh"
    # As many CPU slots as GPU slots per executor: otherwise GPUs stay idle (or ranks share one).
    cpu_slots = int(props["spark.executor.cores"]) // int(props.get("spark.task.cpus", "1"))
    assert cpu_slots == executor_gpus // task_gpus
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert re.search(r"-Dlog4j2\.configurationFile=\S*log4j2\.properties", props[key]), key
    assert props["spark.dist.checkpointDir"].startswith("/shared/")  # visible to every executor


# ---------------------------------------------------------------------------------------------- sessions
@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One JVM: a session from the local template with conf/log4j2.properties, plus a key check of every
    template (and of a template with a typo, to show the check catches one)."""
    typo = tmp_path_factory.mktemp("typo") / "spark-defaults.typo.conf"
    typo.write_text("spark.locality.wiat 0s\nspark.executor.resource.gpu.amount 1\n")
    result = run_command([sys.executable, os.path.join(SCRIPTS, "conf_probe.py"), LOCAL, LOG4J, LOCAL,
                          *GPU_TEMPLATES, str(typo)], timeout=240)
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout), result.stderr


def test_local_template_starts_a_session_with_its_settings(probe):
    report, _ = probe
    assert report["conf"] == read_properties(LOCAL)
    # local[*] gave one barrier slot per core, and a barrier stage over all of them ran.
    assert report["barrier"] == [1] * report["default_parallelism"]


def test_log4j2_file_is_used_and_keeps_spark_quiet(probe):
    report, stderr = probe
    assert report["log4j"]["location"] == LOG4J
    assert report["log4j"]["spark_warn_enabled"] is False
    assert report["log4j"]["spark_error_enabled"] is True
    # Without the file this session prints Spark's banner and "WARN NativeCodeLoader" at least.
    assert " WARN " not in stderr and " INFO " not in stderr, stderr
    assert "Setting default log level" not in stderr
    assert "StatusLogger" not in stderr  # log4j2's complaints about its own configuration


def test_every_template_key_is_a_spark_setting(probe):
    report, _ = probe
    unknown = report["unknown_keys"]
    assert unknown.pop("spark-defaults.typo.conf") == ["spark.locality.wiat"]
    assert unknown == {os.path.basename(p): [] for p in [LOCAL, *GPU_TEMPLATES]}


def test_gpu_standalone_template_gives_each_rank_its_own_gpu(standalone_cluster, tmp_path):
    """spark-submit with the GPU standalone template on a standalone cluster whose two workers have one
    (fake) GPU each: a --use-gpu run gets one rank per GPU. Only sizes this machine cannot give are
    overridden (cores, memory, GPUs per executor) and paths of a real installation."""
    from test_cli import spark_submit

    out = tmp_path / "ranks"
    out.mkdir()
    overrides = {
        "spark.executor.cores": "1", "spark.task.cpus": "1", "spark.executor.resource.gpu.amount": "1",
        "spark.executor.memory": "1g", "spark.driver.memory": "1g",
        "spark.dist.checkpointDir": str(tmp_path / "checkpoints"),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J}",
    }
    spark_args = ["--properties-file", GPU_TEMPLATES[0]]
    for key, value in overrides.items():
        spark_args += ["--conf", f"{key}={value}"]
    result = spark_submit(standalone_cluster, spark_args,
                          ["--use-gpu", "--num-processes", "2", os.path.join(SCRIPTS, "report_env.py"), out],
                          tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["WORLD_SIZE"] for r in ranks] == ["2", "2"]
    # torchrun's convention: rank r uses cuda:LOCAL_RANK among the host's visible GPUs (both workers
    # share this host); that must be a different worker GPU for each rank.
    own = [r["CUDA_VISIBLE_DEVICES"].split(",")[int(r["LOCAL_RANK"])] for r in ranks]
    assert sorted(own) == ["0", "1"]
    assert " WARN " not in result.stdout + result.stderr  # the log4j2 file kept spark-submit quiet
