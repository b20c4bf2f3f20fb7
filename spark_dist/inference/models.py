"""Load a model inside ``make_predict_fn``, from the places people keep one: a checkpoint of a spark_dist run (or
any ``torch.save`` of a ``state_dict``), a pickled module (or a saved :class:`~spark_dist.ml.TorchModel`), a
``transformers`` directory written by ``save_pretrained``, and an MLflow ``pytorch`` flavour model.

Each runs where it is called: in ``make_predict_fn``, that is once per Python worker on the executor (the
model cache keeps the result, :mod:`.cache`), reading a path on the executor's disk (a local or shared
filesystem path, or ``file:``); only MLflow URIs reach further, through MLflow itself. Each returns the module
on ``device`` (the CPU unless told), in eval mode.

What is unpickled: a pickled module, a saved TorchModel and an MLflow model saved as a pickle are, as
``torch.load`` and MLflow load them; load only what you or someone you trust wrote. A checkpoint is read with
``torch.load(weights_only=True)`` (tensors and plain containers, no code run); one that holds other objects is
unpickled only when the file and its directory pass the checks a rank makes before resuming from it
(:mod:`spark_dist.task.checkpoint_dirs`: this user's, writable by nobody else, no symbolic link, under no
directory others can write; checked on the descriptor then read, :mod:`spark_dist.host.ownership`); a sharded
checkpoint is always checked so.
"""
from __future__ import annotations

import json
import os
import pickle
from typing import Any, Callable, Mapping, Optional, Union

from ..data.urls import local_path
from ..task import checkpoint_dirs, sharded_checkpoints
from ..task.checkpoints import CHECKPOINT_FILE

PathLike = Union[str, "os.PathLike[str]"]
STATE_KEYS = ("model", "model_state_dict", "state_dict")  # where a dict of states usually keeps the model's
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # what DDP / DataParallel and torch.compile put before every key
SAVED_OBJECTS = "torch.pt"  # a saved TorchModel's pickled Params (spark_dist/ml/persistence.py)


def load_from_checkpoint(model_fn: Callable[[], Any], path: PathLike, *, key: Optional[str] = None,
                         strict: bool = True, device: Any = "cpu"):
    """The module ``model_fn()`` builds, with the weights of the checkpoint at ``path``.

    ``path`` is a file written with ``torch.save`` (``ctx.save_checkpoint(...)`` writes the run's
    ``<checkpoint dir>/<run_id>/checkpoint.pt``; any ``torch.save(model.state_dict(), f)`` does too), a
    run's checkpoint directory (its latest checkpoint, rank 0's or sharded), or one sharded checkpoint's
    directory (``<run dir>/sharded/<seq>``, as ``Distributor.best_checkpoint`` names it): a sharded state is
    read whole, each FSDP2 parameter complete, so any number of ranks may have written it. What it holds may be the module's ``state_dict``
    itself, or a dict of states (``{"model": ..., "optimizer": ..., "epoch": ...}``): ``key`` names the
    module's, by default the first of ``"model"``, ``"model_state_dict"`` and ``"state_dict"`` there.
    The ``module.`` of a DDP-wrapped model's keys and the ``_orig_mod.`` of a compiled one's are dropped when
    the module's own keys have none. ``model_fn`` may be the module itself instead of a function building it.

    Raises:
        FileNotFoundError: nothing at ``path``, or a directory without ``checkpoint.pt``.
        ValueError: ``path`` is not a local path; no state under ``key`` (the message lists the keys there).
        CheckpointDirError: (a ``PermissionError``) the checkpoint holds objects other than tensors, which only
            unpickling reads, and the file, its directory or a directory above it is not this user's alone (a
            sharded checkpoint: always checked so); the message names the path.
        TypeError: ``model_fn`` built something that is not a ``torch.nn.Module``.
        RuntimeError: the state does not fit the module (torch's message, naming the keys; ``strict=False``
            skips missing and unexpected keys, not shapes that differ).
    """
    import torch

    state = _pick_state(read_checkpoint(path), key, path)
    model = model_fn if isinstance(model_fn, torch.nn.Module) else model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn returned {type(model).__name__}, not a torch.nn.Module to load the weights into")
    state = _unwrapped(state, model.state_dict())
    try:
        model.load_state_dict(state, strict=strict)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\nload_from_checkpoint: the state in {os.fspath(path)} does not fit the module "
                           "model_fn built: build the architecture it was saved from, pick another state with "
                           "key=, or skip missing and unexpected keys with strict=False") from exc
    return model.to(device).eval()


def read_checkpoint(path: PathLike, map_location: Any = "cpu") -> Any:
    """What the checkpoint at ``path`` holds (a file, or a run's directory holding ``checkpoint.pt``), on
    ``map_location``: :func:`load_from_checkpoint` reads it here, the one place that knows checkpoint formats.
    A ``torch.save`` file is read; so is a sharded checkpoint (``ctx.save_checkpoint(state, sharded=True)``,
    written through ``torch.distributed.checkpoint``): one checkpoint's directory, or a run's directory whose
    latest checkpoint is one, read with every tensor whole (an FSDP2 model's too).

    Raises:
        FileNotFoundError, ValueError, CheckpointDirError: as :func:`load_from_checkpoint`.
    """
    import torch

    local = _local(path, "path")
    if os.path.isdir(local):
        sharded = _latest_sharded(local)
        if sharded is not None:
            return _on(sharded_checkpoints.load_full(sharded), map_location)
        file = os.path.join(local, CHECKPOINT_FILE)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"path={local!r}: a directory without {CHECKPOINT_FILE}; give the checkpoint "
                                    "file, or the run's checkpoint directory (<checkpoint dir>/<run_id>)")
    elif os.path.exists(local):
        file = local
    else:
        raise FileNotFoundError(f"path={local!r}: no such checkpoint on this host ({_where()})")
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        pass  # more than tensors and containers: unpickled only where a rank would resume from it
    file = os.path.abspath(file)
    try:
        f = checkpoint_dirs.open_checked(os.path.dirname(file), os.path.basename(file))
    except checkpoint_dirs.CheckpointDirError as exc:
        raise checkpoint_dirs.CheckpointDirError(
            exc.path, exc.problem, lead=f"path={file!r} holds objects other than tensors, which only unpickling "
            "reads. ", fix="copy it to a directory only you can write, or save the states alone "
            "(torch.save(model.state_dict(), path))") from exc
    if f is None:
        raise FileNotFoundError(f"path={file!r}: no such checkpoint on this host ({_where()})")
    with f:
        return torch.load(f, map_location=map_location, weights_only=False)


def load_pickled_module(path: PathLike, *, device: Any = "cpu"):
    """The module pickled at ``path``: a ``torch.save(module, f)`` file (a TorchScript file too), or the
    directory of a :class:`~spark_dist.ml.TorchModel` saved with ``model.write().save(path)`` (its module; a
    saved ``PipelineModel`` with one TorchModel stage, that stage's). It is unpickled: load only what you or
    someone you trust saved.

    Raises:
        FileNotFoundError: nothing at ``path``, or a directory that is no saved TorchModel.
        ValueError: ``path`` is not a local path; a saved stage other than a TorchModel, or a pipeline with
            several.
        TypeError: the file holds no module (a ``state_dict``: use :func:`load_from_checkpoint`).
    """
    import torch

    local = _local(path, "path")
    if os.path.isdir(local):
        return _saved_torch_model(local).to(device).eval()
    if not os.path.exists(local):
        raise FileNotFoundError(f"path={local!r}: no such file on this host ({_where()})")
    module = torch.load(local, map_location="cpu", weights_only=False)
    if not isinstance(module, torch.nn.Module):
        hint = (": a state_dict, which load_from_checkpoint(model_fn, path) loads into the module you build"
                if isinstance(module, Mapping) else "")
        raise TypeError(f"path={local!r} holds a {type(module).__name__}, not a pickled torch.nn.Module{hint}")
    return module.to(device).eval()


def load_pretrained(path: PathLike, *, model_class: Any = None, device: Any = "cpu", **kwargs):
    """The ``transformers`` model saved with ``save_pretrained(path)``, read from that directory alone (never
    from the Hugging Face Hub: ``local_files_only=True``). ``model_class`` (a class, or its name in
    ``transformers``: ``"AutoModelForSequenceClassification"``) picks the head; by default the class that
    saved it (the config's ``architectures``), else ``AutoModel``. ``kwargs`` go to ``from_pretrained``
    (``dtype=``, ...).

    Raises:
        FileNotFoundError: ``path`` is no directory holding ``config.json``.
        ValueError: ``path`` is not a local path, or ``model_class`` names no class of ``transformers``.
        ImportError: ``transformers`` is not installed on the executor.
    """
    import transformers

    local = _local(path, "path")
    if not os.path.isfile(os.path.join(local, "config.json")):
        raise FileNotFoundError(f"path={local!r}: no config.json in such a directory on this host ({_where()}); "
                                "give the directory model.save_pretrained(...) wrote (Hub names are not "
                                "downloaded here: save the model once, where every executor reads it)")
    if isinstance(model_class, str):
        named = getattr(transformers, model_class, None)
        if named is None:
            raise ValueError(f"model_class={model_class!r} is no class of transformers {transformers.__version__}")
        model_class = named
    if model_class is None:
        config = transformers.AutoConfig.from_pretrained(local, local_files_only=True)
        saved = (getattr(config, "architectures", None) or [None])[0]
        model_class = getattr(transformers, saved, None) if saved else None
        model_class = model_class or transformers.AutoModel
    model = model_class.from_pretrained(local, local_files_only=True, **kwargs)
    return model.to(device).eval()


def load_mlflow_model(model_uri: str, *, tracking_uri: Optional[str] = None, device: Any = None, **kwargs):
    """The MLflow ``pytorch`` flavour model at ``model_uri``, as ``mlflow.pytorch.load_model`` returns it: a
    local path or ``file:`` URI of the model's directory, an artifact store's URI, or ``runs:/<run_id>/<path>``
    and ``models:/<name>/<version>`` (which ask the tracking server, ``tracking_uri`` or the executor's
    ``MLFLOW_TRACKING_URI``: spark_dist gives executors no MLflow settings of the driver's). A model saved in
    MLflow's ``pt2`` format (its default) is a ``torch.export`` program's module, which refuses ``eval()`` and
    ``to()``; ``device`` (``"cuda"``) is MLflow's. ``kwargs`` go to ``torch.load`` for a pickled model.

    Raises:
        ValueError: a ``runs:/`` or ``models:/`` URI with neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI``.
        ImportError: ``mlflow`` is not installed on the executor.
        mlflow.exceptions.MlflowException: MLflow's own errors (no pytorch flavour there; a pickled model while
            ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION`` is not set; a file store while ``MLFLOW_ALLOW_FILE_STORE``
            is not set).
    """
    from urllib.parse import urlparse

    scheme = urlparse(str(model_uri)).scheme
    if scheme in ("runs", "models") and not (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
        raise ValueError(f"model_uri={model_uri!r} asks the MLflow tracking server, which this worker does not know: "
                         "pass tracking_uri=, set spark.executorEnv.MLFLOW_TRACKING_URI, or give the model's "
                         "artifact location (a path or storage URI) instead")
    import contextlib

    import mlflow.pytorch
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    # MLflow's own download_artifacts(tracking_uri=) still looks a run's logged models up in the process's
    # tracking store (mlflow 3.17): the URI is set for the load alone, and put back as it was (unset, too).
    with _use_tracking_uri(tracking_uri) if tracking_uri else contextlib.nullcontext():
        # A local model is read where it is; another is copied to a temp dir first (MLflow's).
        return mlflow.pytorch.load_model(str(model_uri), device=device, **kwargs)


# ------------------------------------------------------------------------------------------------------------
def _local(path: PathLike, name: str) -> str:
    """``path`` (a path or a ``file:`` URI) as a path of this host."""
    local = local_path(os.fspath(path))
    if local is None:
        raise ValueError(f"{name}={os.fspath(path)!r} is not a local path: the model loads in each Python worker, "
                         "from the executor's own disk; copy it to a path every executor reads (a shared "
                         "filesystem, or SparkContext.addFile and SparkFiles.get)")
    return os.path.abspath(local)


def _where() -> str:
    import socket

    return f"host {socket.gethostname()}"


def _latest_sharded(directory: str) -> Optional[str]:
    """The sharded (``torch.distributed.checkpoint``) checkpoint to read at ``directory``: the directory itself
    when it is one (committed: its ``COMMITTED.json``), or a run's latest committed one when that is newer
    than its ``checkpoint.pt`` (if any); else ``None``."""
    if os.path.isfile(os.path.join(directory, ".metadata")):
        return directory
    if not os.path.isdir(os.path.join(directory, sharded_checkpoints.SHARDED_DIR)):
        return None
    found = sharded_checkpoints.committed(directory)
    file = os.path.join(directory, CHECKPOINT_FILE)
    if found and (not os.path.isfile(file) or found[-1].time > os.path.getmtime(file)):
        return found[-1].path
    return None


def _on(state: Any, map_location: Any) -> Any:
    """``state``'s tensors moved to ``map_location`` (a sharded checkpoint is read onto the CPU)."""
    import torch

    if map_location in (None, "cpu"):
        return state
    if isinstance(state, torch.Tensor):
        return state.to(map_location)
    if isinstance(state, Mapping):
        return {k: _on(v, map_location) for k, v in state.items()}
    return state


def _pick_state(saved: Any, key: Optional[str], path: PathLike) -> Mapping[str, Any]:
    """The module's state in what a checkpoint holds: the state itself, or the one under ``key``."""
    import torch

    if key is not None:
        if not isinstance(saved, Mapping) or key not in saved:
            keys = sorted(map(str, saved)) if isinstance(saved, Mapping) else type(saved).__name__
            raise ValueError(f"key={key!r}: no such entry in the checkpoint {os.fspath(path)} (it holds {keys})")
        state = saved[key]
    elif isinstance(saved, Mapping) and all(isinstance(v, torch.Tensor) for v in saved.values()):
        state = saved
    else:
        found = [k for k in STATE_KEYS if isinstance(saved, Mapping) and isinstance(saved.get(k), Mapping)]
        if not found:
            keys = sorted(map(str, saved)) if isinstance(saved, Mapping) else type(saved).__name__
            raise ValueError(f"the checkpoint {os.fspath(path)} holds no state_dict: neither tensors alone nor "
                             f"one under {', '.join(map(repr, STATE_KEYS))} (it holds {keys}); name the "
                             "module's state with key=")
        state = saved[found[0]]
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    if not isinstance(state, Mapping):
        raise ValueError(f"key={key!r}: the checkpoint {os.fspath(path)} holds a {type(state).__name__} there, "
                         "not a state_dict")
    return state


def _unwrapped(state: Mapping[str, Any], own: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` without the prefix a wrapper (DDP, ``torch.compile``) put before every key, when the module's
    own keys (``own``) do not start with it."""
    changed = True
    while changed and state:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
                state = {k[len(prefix):]: v for k, v in state.items()}
                changed = True
    return state


def _saved_torch_model(directory: str):
    """The module of a saved TorchModel directory (``metadata/`` and ``torch.pt``), or of a saved pipeline's
    single TorchModel stage."""
    stages = os.path.join(directory, "stages")
    if not os.path.isfile(os.path.join(directory, SAVED_OBJECTS)) and os.path.isdir(stages):
        found = sorted(s for s in os.listdir(stages) if os.path.isfile(os.path.join(stages, s, SAVED_OBJECTS)))
        if len(found) != 1:
            raise ValueError(f"path={directory!r} is a saved pipeline with {len(found)} stages holding a torch "
                             f"module ({', '.join(found) or 'none'}): give the stage's directory, "
                             f"{os.path.join(stages, '<stage>')}")
        directory = os.path.join(stages, found[0])
    objects = os.path.join(directory, SAVED_OBJECTS)
    if not os.path.isfile(objects):
        raise FileNotFoundError(f"path={directory!r}: a directory, but no saved TorchModel ({SAVED_OBJECTS} and "
                                f"metadata/ in it) on {_where()}")
    stage = _stage_class(directory)
    if stage is not None and not stage.endswith(".TorchModel"):
        raise ValueError(f"path={directory!r} holds a saved {stage}, not a TorchModel (a fitted model)")
    import torch

    return torch.load(objects, map_location="cpu", weights_only=False)["model"]


def _stage_class(directory: str) -> Optional[str]:
    """The class Spark's metadata of a saved stage names (``metadata/part-00000``), if it is there."""
    folder = os.path.join(directory, "metadata")
    parts = sorted(p for p in os.listdir(folder) if p.startswith("part-")) if os.path.isdir(folder) else []
    for part in parts:
        with open(os.path.join(folder, part)) as f:
            for line in f:
                if line.strip():
                    return json.loads(line).get("class")
    return None


__all__ = ["load_from_checkpoint", "load_mlflow_model", "load_pickled_module", "load_pretrained", "read_checkpoint"]
