"""A :class:`~spark_dist.DeepspeedTorchDistributor` run inside a rank: what PySpark's gives a script (and the
``sys.argv`` of its functions), ``--deepspeed`` and ``--deepspeed_config FILE``, and the config itself as
``ctx.deepspeed_config``.

FILE is the path the user gave where it exists on this host (as PySpark passes it); else a copy of what the
driver read (or the dict it was given, as JSON), written owner-only into the rank's work directory, which goes
with the rank.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Dict, Optional

from ..errors import ConfigError
from ..host.tempdirs import write_private
from ..wire.protocol import Job

CONFIG_FILE = "deepspeed_config.json"


def parse(text: str, where: str) -> Dict[str, Any]:
    """A DeepSpeed config's text as a dict: JSON, or HJSON where ``hjson`` (a dependency of DeepSpeed, which
    reads its config files with it) is installed.

    Raises:
        ConfigError: neither, or not an object; naming ``deepspeedConfig`` and ``where``.
    """
    try:
        config = json.loads(text)
    except ValueError as exc:
        try:
            import hjson
        except ImportError:
            raise ConfigError(f"deepspeedConfig {where} is not JSON: {exc}") from None
        try:
            config = dict(hjson.loads(text))
        except Exception as hjson_exc:
            raise ConfigError(f"deepspeedConfig {where} is neither JSON nor HJSON: {hjson_exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"deepspeedConfig {where} must hold a JSON object, got {type(config).__name__}")
    return config


def prepare(job: Job, ctx, workdir: str) -> Job:
    """The job as this rank runs it: for a DeepSpeed run, the arguments appended to a script's, set as a
    function's ``sys.argv[1:]``, and ``ctx.deepspeed_config`` set; any other job unchanged.

    Raises:
        ConfigError: the config path exists neither on this host nor on the driver, or does not parse.
    """
    if not job.deepspeed:
        return job
    path, config = _config_file(job, ctx.host, workdir)
    ctx._deepspeed_config = config
    args = ("--deepspeed",) + (("--deepspeed_config", path) if path else ())
    if job.script_path is not None:
        return dataclasses.replace(job, script_args=tuple(job.script_args) + args)
    sys.argv = [sys.argv[0] if sys.argv else "", *args]
    return job


def _config_file(job: Job, host: str, workdir: str):
    """(the path the ranks are given, the config as a dict), or ``(None, None)`` without a config."""
    given: Optional[str] = job.deepspeed_config_path
    if given and os.path.isfile(given):
        with open(given, encoding="utf-8") as f:
            return given, parse(f.read(), f"file {given!r}")
    if job.deepspeed_config_text is None:
        if given:
            raise ConfigError(f"deepspeedConfig file {given!r} exists neither on this host ({host}) nor on "
                              f"the driver: pass a path every executor can read, or the config as a dict")
        return None, None

    path = os.path.join(workdir, CONFIG_FILE)
    write_private(path, job.deepspeed_config_text.encode("utf-8"))
    return path, parse(job.deepspeed_config_text, "(as the driver read it)")
