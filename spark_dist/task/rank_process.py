"""Inside a rank process: what a forked or spawned rank runs (:func:`child_main`), how it reports to the
driver (the run's store), and how it ends (:func:`exit_rank`).

The rank writes ``result.pkl`` or ``failure.pkl`` into the work directory its supervisor made
(:mod:`spark_dist.task.barrier_task`), which reads it once the rank has exited.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Dict, Optional

from ..errors import RankFailure, RunResized
from ..horovod import IMPL_ENV, install_as_horovod, run_checkpoint
from ..wire.protocol import INPUT_STATS_KEY, PROGRESS, REPORTS, RESIZE, Job, LaunchSpec
from ..wire.ranks import RankInfo
from ..wire.sealed_store import SealedStore, join_store
from ..wire.store_log import StoreLog
from . import deepspeed_args, flight_recorder, steps
from ..host.tempdirs import write_private
from .warm_imports import IMPORTED_DYNAMO


STACK_FILE = "stack.txt"  # in the rank's work directory: where its Python stack goes when its supervisor asks
REPORT_CONFIRM_EVERY = 8  # ctx.report's records between two round trips to the store (see _Reporter)


def join_run_store(spec: LaunchSpec) -> SealedStore:
    return SealedStore(join_store(spec.store_host, spec.store_port, spec.rendezvous_timeout), spec.secret, spec.prefix)


def exit_rank(code: int) -> None:
    """End a rank process: the exit handlers the rank registered itself (MLflow, TensorBoard and wandb flush
    their runs here; a forked rank cleared the worker's when it started), every buffered output line, then
    ``os._exit``. No interpreter teardown: a forked rank must not run the worker's own, and freeing the
    process groups :mod:`spark_dist.task.teardown` keeps could hang in torch's gloo destructor."""
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed by the rank's code
                pass
        _flush_c_stdio()
    finally:
        os._exit(code)


def _flush_c_stdio() -> None:
    """What C or C++ code printed (``printf``, ``std::cout`` through stdio) and still buffers: ``exit()`` would
    flush it, ``os._exit`` does not."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def child_main(spec: LaunchSpec, rank: RankInfo, env: Dict[str, str], workdir: str) -> int:
    """Run the job as rank ``rank``; write ``result.pkl`` or ``failure.pkl`` into ``workdir``; return the
    exit code."""
    import faulthandler

    import cloudpickle

    from . import context
    from . import teardown

    os.environ.update(env)
    if env.get(IMPL_ENV) == "torch":  # backend="horovod" on spark_dist.horovod: `import horovod.torch` finds it
        install_as_horovod(force=True)
        # hvd.elastic's commits are the run's checkpoints (spark_dist.horovod.run_checkpoint)
        run_checkpoint.attach(lambda obj: context.get_context().save_checkpoint(obj),
                              lambda: context.get_context().load_checkpoint())
    teardown.keep_process_groups_until_exit()  # a rank that frees its DDP model could hang at exit otherwise
    faulthandler.enable()  # a crash (SIGSEGV, SIGABRT) prints the Python stack into the captured stderr
    # The supervisor asks for the stack (on a timeout, a stall) and reads it from a file of its own, so that the
    # dump never shows among the lines the rank printed. Appending: the supervisor empties it before it asks.
    stack_file = open(os.path.join(workdir, STACK_FILE), "a")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    if spec.collective_timeout:
        _set_collective_timeout(spec.collective_timeout)
    if spec.use_gpu:  # NCCL's Flight Recorder: its dump goes with a stall's diagnosis
        flight_recorder.start(workdir)
    reporter = _Reporter(spec, rank.rank)
    clock = steps.StepClock(os.path.join(workdir, steps.CLOCK_FILE))
    clock.time_group_setup()
    ctx = context.TrainContext(
        rank=rank.rank, local_rank=rank.local_rank, world_size=rank.world_size,
        local_world_size=rank.local_world_size, node_rank=rank.node_rank, attempt=spec.attempt,
        run_id=spec.run_id, host=rank.host, use_gpu=spec.use_gpu, gpus=rank.gpus, checkpoint_dir=spec.checkpoint_dir,
        datasets=dict(spec.datasets), _reporter=reporter,
        initial_world_size=spec.initial_world_size or rank.world_size, previous_world_size=spec.previous_world_size,
        _watch_resize=spec.watch_resize, step_clock=clock,
    )
    context._set_context(ctx)
    teardown.before_destroy(ctx.wait_for_checkpoints)
    try:
        job: Job = deepspeed_args.prepare(cloudpickle.loads(spec.job_bytes), ctx, workdir)
        clock.function_started()
        if job.script_path is not None:
            _run_script(job, workdir)
            result = None
        else:
            started = time.perf_counter()
            result = job.fn(*job.args, **job.kwargs)
            _report_steps(ctx, reporter, time.perf_counter() - started)
        clock.function_ended()
        ctx.wait_for_checkpoints()  # an asynchronous save in flight belongs to the run that returned
        from .result import encode_result

        data = encode_result(result if rank.rank == 0 or spec.every_result else None, spec.max_result_bytes)
        write_private(os.path.join(workdir, "result.pkl"), data)
        return 0
    except SystemExit as exc:  # a script's sys.exit(n)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 0:
            ctx.wait_for_checkpoints()
            write_private(os.path.join(workdir, "result.pkl"), cloudpickle.dumps(None))
            return 0
        failure = RankFailure(rank.rank, rank.host, "exit", f"sys.exit({exc.code!r})", exit_code=code,
                              traceback=traceback.format_exc(), time=time.time())
        write_private(os.path.join(workdir, "failure.pkl"), pickle.dumps(failure))
        return code
    except RunResized as exc:  # rank 0 of an elastic run stopped at a checkpoint: the next attempt resizes
        failure = RankFailure(rank.rank, rank.host, "resized", str(exc), exc_type="spark_dist.errors.RunResized",
                              time=time.time())
        write_private(os.path.join(workdir, "failure.pkl"), pickle.dumps(failure))
        return 1
    except BaseException as exc:
        failure = RankFailure(rank.rank, rank.host, "exception", str(exc),
                              exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", ""),
                              traceback=traceback.format_exc(), time=time.time(),
                              exception_bytes=_try_pickle(exc))
        write_private(os.path.join(workdir, "failure.pkl"), pickle.dumps(failure))
        traceback.print_exc()
        return 1
    finally:
        context._set_context(None)
        try:
            reporter.flush()
        except Exception:  # noqa: BLE001 -- the store is gone: the run is over for this rank anyway
            pass
        # A rank that trained imported torch._dynamo (torch.optim's step does): the worker warms up for the next
        # run. A rank forked from a worker already warm has it anyway; the warm-up then has nothing to do.
        if "torch._dynamo" in sys.modules:
            try:
                write_private(os.path.join(workdir, IMPORTED_DYNAMO), b"")
            except OSError:
                pass  # only a hint


def _report_steps(ctx, reporter, seconds: float) -> None:
    """Tell the driver how long this rank waited for data, so a user sees when input is the bottleneck, and how
    its steps took their time (:meth:`spark_dist.task.steps.StepClock.summary`), which names a straggler."""
    timed = ctx.step_clock.summary() if ctx.step_clock is not None else {}
    if not ctx.loaders and not timed:
        return
    record = {INPUT_STATS_KEY: True, "rank": ctx.rank, "host": ctx.host, "time": time.time(),
              "train_seconds": round(seconds, 3), **timed}
    if ctx.loaders:
        record.update(input_wait_seconds=round(sum(loader.wait_seconds for loader in ctx.loaders), 3),
                      batches=sum(loader.batches for loader in ctx.loaders))
    reporter(record)


def _set_collective_timeout(seconds: float) -> None:
    """Make ``init_process_group()`` without ``timeout=`` use ours: a collective whose peer never comes
    then raises instead of waiting torch's default 30 minutes."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=seconds)
    c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


def _run_script(job: Job, workdir: str) -> None:
    """Run a script as ``python script.py args`` would, in this already-warm interpreter."""
    import runpy

    path = job.script_path
    if not os.path.exists(path):  # another machine: run the copy the driver shipped
        path = os.path.join(workdir, os.path.basename(job.script_path))
        write_private(path, job.script_source)
    sys.argv = [path, *job.script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def _try_pickle(exc: BaseException) -> Optional[bytes]:
    try:
        import cloudpickle

        data = cloudpickle.dumps(exc)
        cloudpickle.loads(data)
        return data
    except Exception:
        return None


class _Reporter:
    """Sends ``ctx.report`` records to the driver through the run's ``reports`` log, and rank 0's loader
    progress as one overwritten value (connected on first use)."""

    def __init__(self, spec: LaunchSpec, rank: int):
        self._spec, self._rank = spec, rank
        self._store: Optional[SealedStore] = None
        self._log: Optional[StoreLog] = None
        self._unconfirmed = 0  # records pushed since the last round trip

    def _connected(self) -> SealedStore:
        if self._store is None:
            self._store = join_run_store(self._spec)
            self._log = StoreLog(self._store, REPORTS, writer=f"rank{self._rank}")
        return self._store

    def __call__(self, record: dict) -> None:
        # A round trip every REPORT_CONFIRM_EVERY records, not each: a report costs the driver's store one
        # request, and no more than that many are ever in flight from a rank. The rest is confirmed at the end
        # (flush), before the supervisor says the rank ended: the driver's last drain then finds every report.
        self._connected()
        self._unconfirmed += 1
        confirm = self._unconfirmed >= REPORT_CONFIRM_EVERY
        self._log.append(record, confirm=confirm)
        if confirm:
            self._unconfirmed = 0

    def flush(self) -> None:
        """Return once every report sent is in the store (a round trip, when one is not confirmed yet)."""
        if self._unconfirmed and self._log is not None:
            self._log.confirm()
            self._unconfirmed = 0

    def progress(self, value: tuple) -> None:
        self._connected().put(PROGRESS, value)

    def resize_reason(self) -> Optional[str]:
        """Why the driver asked this elastic run to change size (``None``: it did not)."""
        return self._connected().lookup(RESIZE)
