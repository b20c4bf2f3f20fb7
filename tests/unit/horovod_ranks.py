"""Horovod ranks without Spark, for the ``horovod.torch`` API tests: ``run_horovod_ranks`` spawns ranks that see the
environment a spark_dist rank sees, and runs one scenario in each with either implementation:

* ``"spark_dist"``: :mod:`spark_dist.horovod.torch`. Each rank gets the torchrun variables of
  :func:`spark_dist.backends.base.torchrun_env` (all ranks join a store this process hosts, as the driver hosts
  one), plus, with ``horovod_env``, the ``HOROVOD_*`` rank variables spark_dist's Horovod backend sets.
* ``"horovod"``: the real Horovod build, started the way spark_dist's Horovod backend starts it (its rendezvous
  server here, its variables in each rank), where ``horovod.torch`` is installed.
"""
import contextlib
import importlib
import importlib.util
import os
import time

import torch
import torch.multiprocessing as mp

from spark_dist.backends.base import torchrun_env
from spark_dist.wire.ranks import TaskInfo, assign_ranks
from tests.free_ports import free_ports


def real_horovod_available() -> bool:
    """Whether a Horovod build with its torch extension is installed (without importing it here)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    torch_dir = os.path.join(spec.submodule_search_locations[0], "torch")
    return any(name.startswith("mpi_lib_v2") for name in os.listdir(torch_dir)) if os.path.isdir(torch_dir) else False


def _rank(rank, impl, envs, scenario, out, leave_with_barrier):
    os.environ.update(envs[rank])
    hvd = importlib.import_module("spark_dist.horovod.torch" if impl == "spark_dist" else "horovod.torch")
    result = scenario(hvd)
    torch.save(result, f"{out}.{rank}.part")
    os.replace(f"{out}.{rank}.part", f"{out}.{rank}")
    if not leave_with_barrier:
        # Real Horovod's background thread aborts its process when a peer leaves first: wait to be killed by the
        # parent once every rank's result is in.
        time.sleep(600)
    # Every rank is done, then each leaves without tearing gloo down, as a spark_dist rank does (see gloo_ranks).
    if hvd.is_initialized():
        hvd.barrier()
    os._exit(0)


def _ranks(hosts):
    return assign_ranks([TaskInfo(i, host) for i, host in enumerate(hosts)])


def _horovod_vars(r):
    return {"HOROVOD_HOSTNAME": r.host, "HOROVOD_RANK": str(r.rank), "HOROVOD_SIZE": str(r.world_size),
            "HOROVOD_LOCAL_RANK": str(r.local_rank), "HOROVOD_LOCAL_SIZE": str(r.local_world_size),
            "HOROVOD_CROSS_RANK": str(r.cross_rank), "HOROVOD_CROSS_SIZE": str(r.cross_size)}


@contextlib.contextmanager
def horovod_job(impl, hosts, horovod_env=True):
    """Each rank's environment for a job of one rank per entry of ``hosts`` (each rank's host name, which decides
    local and cross ranks), by rank; what the ranks meet through runs until the block ends: for ``"horovod"``,
    Horovod's rendezvous server, started as spark_dist's Horovod backend starts it; for ``"spark_dist"``, the
    store every rank joins (the torchrun variables, plus the ``HOROVOD_*`` rank variables with ``horovod_env``)."""
    import torch.distributed as dist

    ranks = _ranks(hosts)
    port = free_ports(1)
    envs = {r.rank: torchrun_env(r, "127.0.0.1", port, 0, use_gpu=False) for r in ranks}
    backend = store = None
    try:
        if impl == "horovod":
            from spark_dist.backends.horovod import HorovodBackend

            backend = HorovodBackend()
            for rank, env in backend.start(ranks, "127.0.0.1", "test").items():
                envs[rank].update(env, HOROVOD_GLOO_IFACE="lo", HOROVOD_HOSTNAME=ranks[rank].host)
        else:
            # the store every rank joins as a client (TORCHELASTIC_USE_AGENT_STORE), as the driver's
            store = dist.TCPStore("127.0.0.1", port, len(ranks), is_master=True, wait_for_workers=False)
            for r in ranks:
                if horovod_env:
                    envs[r.rank].update(_horovod_vars(r))
        yield envs
    finally:
        if backend is not None:
            backend.stop()
        del store


def run_horovod_ranks(impl, hosts, scenario, tmp_path, horovod_env=True, leave_with_barrier=True, timeout=60):
    """``scenario(hvd)`` in one spawned rank per entry of ``hosts`` (see :func:`horovod_job`); returns each
    rank's return value, by rank. Ranks meet in a barrier before they leave, unless ``leave_with_barrier`` is
    False (a scenario whose last collectives leave out some ranks). Raises when a rank fails or the ranks take
    longer than ``timeout`` seconds."""
    out = str(tmp_path / f"{impl}-{len(hosts)}-{scenario.__name__}")
    context = None
    with horovod_job(impl, hosts, horovod_env) as envs:
        try:
            context = mp.start_processes(_rank, args=(impl, envs, scenario, out, leave_with_barrier),
                                         nprocs=len(hosts), start_method="spawn", join=False)
            deadline = time.monotonic() + timeout
            while not context.join(timeout=0.2):  # raises when a rank failed
                if not leave_with_barrier and all(os.path.exists(f"{out}.{r}") for r in range(len(hosts))):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{impl} ranks of {scenario.__name__} still running after {timeout} s")
        finally:
            for process in context.processes if context is not None else ():
                if process.is_alive():
                    process.kill()
                process.join(timeout=10)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(len(hosts))]


def error_of(call):
    """``(type name, message)`` of what ``call()`` raises, or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the scenarios record what each implementation raises
        return type(exc).__name__, str(exc)
    return None


def assert_same(ours, theirs, path="result", atol=0.0):
    """Recursively equal: tensors (same dtype, shape and values, within ``atol``), numbers, strings, containers."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{path}: {ours!r} is not a tensor"
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), \
            f"{path}: {ours.dtype}{list(ours.shape)} != {theirs.dtype}{list(theirs.shape)}"
        if ours.is_sparse:
            ours, theirs = ours.to_dense(), theirs.to_dense()
        same = torch.equal(ours, theirs) if atol == 0 else torch.allclose(ours.double(), theirs.double(), atol=atol)
        assert same, f"{path}: {ours} != {theirs}"
    elif isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs), f"{path}: keys {sorted(ours)} != {sorted(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]", atol)
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), f"{path}: {ours!r} != {theirs!r}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]", atol)
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"
