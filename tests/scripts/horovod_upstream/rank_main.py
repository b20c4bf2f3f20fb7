"""One rank of Horovod 0.28.1's own tests or examples, copied here unchanged (``test/``, ``examples/``), run with
either implementation of ``horovod.torch``; tests/unit/horovod_suite_ranks.py starts the ranks of a job.

    python rank_main.py IMPL OUT pytest [PYTEST ARGS...]            Horovod's test/parallel/test_torch.py
    python rank_main.py IMPL OUT example SEED SCRIPT [SCRIPT ARGS...]   one of its examples

``IMPL``: ``horovod`` (the Horovod build) or ``spark_dist`` (:mod:`spark_dist.horovod`, aliased as ``horovod``
by ``install_as_horovod(force=True)`` before anything imports ``horovod``). The rank's environment (its rank
and the job's rendezvous) comes from the parent.

``pytest``: runs pytest on the test file (default: all of it) with this folder's own ini, so that neither the
project's pytest.ini nor its conftest.py take part; writes a JSON line per event to ``OUT`` as it happens (the
tests collected, each test's start and its outcome), so that the parent sees which test a stuck job is in.
``example``: runs the script as ``__main__`` under :mod:`examples_shim` (seeded, generated data, each loss and
the final weights saved to ``OUT``).

Either way the rank ends with a barrier, when Horovod is still initialized, and leaves without tearing the job
down (``os._exit``), as spark_dist's ranks do: Horovod's background thread aborts a rank whose peer left first.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_FILE = os.path.join(HERE, "test", "parallel", "test_torch.py")
INI = os.path.join(HERE, "horovod_tests.ini")
SUITE_ENV = "SPARK_DIST_HOROVOD_OWN_SUITE"  # conftest.py here lets pytest collect Horovod's tests only with it
HIDE_MUON_ENV = "SPARK_DIST_HOROVOD_HIDE_MUON"  # "1": see _hide_muon


class Recorder:
    """pytest plugin: each event as a JSON line, flushed at once. A test's outcome is ``failed`` when any of its
    phases failed (the first failure's message), else ``skipped`` when one was skipped (the reason), else
    ``passed``."""

    def __init__(self, path):
        self._file = open(path, "a", buffering=1)
        self._outcome = {}
        self._seconds = {}

    def _write(self, **record):
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def pytest_collection_finish(self, session):
        self._write(collected=[item.nodeid for item in session.items])

    def pytest_runtest_logstart(self, nodeid, location):
        self._outcome[nodeid] = ("passed", "")
        self._seconds[nodeid] = 0.0
        self._write(start=nodeid)

    def pytest_runtest_logreport(self, report):
        self._seconds[report.nodeid] += report.duration
        outcome, _ = self._outcome[report.nodeid]
        if report.failed and outcome != "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            self._outcome[report.nodeid] = ("failed", f"{report.when}: {message}"[:2000])
        elif report.skipped and outcome == "passed":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self._outcome[report.nodeid] = ("skipped", reason[:500])

    def pytest_runtest_logfinish(self, nodeid, location):
        outcome, message = self._outcome[nodeid]
        self._write(test=nodeid, outcome=outcome, message=message, seconds=round(self._seconds[nodeid], 3))


def _hide_muon():
    """Leave torch.optim.Muon (newer than Horovod 0.28.1) out of the optimizers Horovod's tests find
    as ``torch.optim`` subclasses of Optimizer: it refuses the tests' 1-D parameters, which fails
    test_broadcast_state, test_broadcast_state_options and test_force_allreduce with either implementation
    before they reach the optimizers after it."""
    import torch

    muon = getattr(torch.optim, "Muon", None)
    if muon is not None:
        muon.__module__ = "hidden_from_horovod_tests"


def _leave(code):
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(impl, out, mode, *args):
    if impl == "spark_dist":
        from spark_dist.horovod import install_as_horovod

        install_as_horovod(force=True)
    elif impl != "horovod":
        raise SystemExit(f"IMPL must be horovod or spark_dist, got {impl!r}")
    if mode == "pytest":
        import pytest

        os.environ[SUITE_ENV] = "1"
        if os.environ.get(HIDE_MUON_ENV) == "1":
            _hide_muon()
        code = pytest.main(["-c", INI, "-p", "no:cacheprovider", "-q", *(args or [TEST_FILE])],
                           plugins=[Recorder(out)])
        _leave(int(code))
    elif mode == "example":
        import examples_shim

        seed, script, *script_args = args
        examples_shim.run(script, script_args, int(seed), out)
        _leave(0)
    raise SystemExit(f"mode must be pytest or example, got {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
