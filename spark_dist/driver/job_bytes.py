"""The run's job as its ranks get it: the training function with its arguments, or a script's source and argv,
pickled once on the driver so that an error in it shows there, before any Spark job."""
from __future__ import annotations

import os

from ..errors import ConfigError
from ..wire.pickling import by_value
from ..wire.protocol import Job


def pickle_job(train_object, args, kwargs, **job_fields) -> bytes:
    """Pickle the function (or read the script) on the driver, so errors show here, before any job.

    Raises:
        ConfigError: ``train_object`` is neither callable nor an existing ``.py`` file.
    """
    import cloudpickle

    if isinstance(train_object, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(train_object))
        if not os.path.isfile(path):
            raise ConfigError(f"train_object {train_object!r} is not a file (pass a function or a .py path)")
        if kwargs:
            raise ConfigError("keyword arguments cannot be passed to a script: pass them as '--name=value' args")
        with open(path, "rb") as f:
            source = f.read()
        job = Job(script_path=path, script_source=source, script_args=tuple(str(a) for a in args), **job_fields)
        return cloudpickle.dumps(job)
    if not callable(train_object):
        raise ConfigError(f"train_object must be a function or a path to a .py file, got {type(train_object).__name__}")
    with by_value([train_object]):
        try:
            return cloudpickle.dumps(Job(fn=train_object, args=tuple(args), kwargs=dict(kwargs), **job_fields))
        except Exception as exc:
            raise ConfigError(f"the training function or its arguments cannot be pickled: {exc}") from exc
