"""Save and load for :class:`TorchEstimator` and :class:`TorchModel`, in ``DefaultParamsWritable`` style.

A saved stage is a directory:

- ``metadata/``: Spark's JSON params file (``DefaultParamsWriter.saveMetadata``): class, uid, the Params
  that are JSON values, and extra fields (``objects``: the names kept in ``torch.pt``; for a model its
  ``history``, ``numFeatures``, ``numOutputs``, ``featureKinds``).
- ``torch.pt``: the Params that are Python objects (``model``, ``transformFn`` and ``inferenceTransformFn``,
  and ``loss`` / ``optimizer`` when callables),
  written by ``torch.save`` with cloudpickle as the pickler: the module object with its weights, and the
  classes of modules that executors could not import (a notebook, a file beside it) by value.

On a classic session both files go through Hadoop's FileSystem API, so any path Spark can write (``file:``,
``hdfs:``, ``s3a:``) works, and ``Pipeline`` / ``PipelineModel`` save their stages here unchanged. Under
Spark Connect the metadata goes through the session's DataFrames (as pyspark.ml's own), and ``torch.pt`` is
written by one executor task (local paths and ``file:``, or pyarrow's file systems for other schemes: its
own credentials, not ``fs.s3a.*``) and read back through Spark's ``binaryFile`` source; both travel inside
one gRPC message, so a model over Connect's 128 MiB message limit cannot be saved or loaded that way.
"""
from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, Tuple

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from ..data.prepare import files
from ..spark import session
from ..wire.pickling import by_value
from .params import OBJECT_PARAMS

OBJECTS_FILE = "torch.pt"


# -- pickling torch objects -----------------------------------------------------------------------------------
def dumps(obj: Any) -> bytes:
    """``torch.save`` with cloudpickle as the pickler (module objects, callables, weights, all in one)."""
    import cloudpickle
    import torch

    values = obj.values() if isinstance(obj, dict) else [obj]
    buffer = io.BytesIO()
    with by_value(values):
        torch.save(obj, buffer, pickle_module=cloudpickle)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


# -- writer and reader --------------------------------------------------------------------------------------
def split_params(instance) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The explicitly set Params as (JSON values, Python objects)."""
    json_params, objects = {}, {}
    for param, value in instance._paramMap.items():
        if param.name in OBJECT_PARAMS and (param.name == "model" or callable(value)):
            if value is not None:
                objects[param.name] = value
            continue
        try:
            json.dumps(value)
        except TypeError:
            raise TypeError(f"cannot save Param {param.name}={value!r}: it is neither JSON nor one of "
                            f"{', '.join(OBJECT_PARAMS)}") from None
        json_params[param.name] = value
    return json_params, objects


class TorchParamsWriter(MLWriter):
    """Writes ``metadata/`` (JSON Params) and ``torch.pt`` (the module and callables) under the path."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:
        if session.is_connect(self.sparkSession):  # MLWriter's own asks the JVM; Connect's ML helper does it there
            from pyspark.ml.connect.readwrite import RemoteMLWriter

            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)

    def saveImpl(self, path: str) -> None:
        json_params, objects = split_params(self.instance)
        extra = dict(self.instance._extra_metadata())
        extra["objects"] = sorted(objects)
        DefaultParamsWriter.saveMetadata(self.instance, path, _context(self.sparkSession), extraMetadata=extra,
                                         paramMap=json_params)
        if objects:
            files.write_bytes(self.sparkSession, os.path.join(path, OBJECTS_FILE), dumps(objects))


class TorchParamsReader(MLReader):
    """Reads what :class:`TorchParamsWriter` wrote, as an instance of the class named in the metadata."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, _context(self.sparkSession))
        module_name, _, class_name = metadata["class"].rpartition(".")
        py_type = getattr(__import__(module_name, fromlist=[class_name]), class_name)
        if not issubclass(py_type, self.cls):
            raise TypeError(f"{path} holds a {metadata['class']}, not a {self.cls.__name__}")
        instance = py_type()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if metadata.get("objects"):
            objects = loads(files.read_bytes(self.sparkSession, os.path.join(path, OBJECTS_FILE)))
            instance._set(**objects)
        instance._load_extra_metadata(metadata)
        return instance


def _context(spark):
    """What pyspark.ml's metadata helpers take: the SparkContext of a classic session (the only thing the
    3.5 line accepts), the session itself under Spark Connect (4.x reads and writes it with DataFrames)."""
    return spark if session.is_connect(spark) else spark.sparkContext


__all__ = ["TorchParamsWriter", "TorchParamsReader", "dumps", "loads"]


class TorchPersistence(MLWritable, MLReadable):
    """``write()`` / ``read()`` for the stages here: params in Spark's metadata, the torch parts in a file of
    their own (``path/torch.pt``). Stages add what else they keep through ``_extra_metadata``."""

    def write(self) -> TorchParamsWriter:
        """A writer: ``stage.write().overwrite().save(path)``."""
        return TorchParamsWriter(self)

    @classmethod
    def read(cls) -> TorchParamsReader:
        return TorchParamsReader(cls)
