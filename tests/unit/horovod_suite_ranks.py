"""Horovod 0.28.1's own tests and examples (copied unchanged into tests/scripts/horovod_upstream/) on 2 CPU ranks over gloo,
with either implementation of ``horovod.torch``: ``"horovod"`` (the build) or ``"spark_dist"``
(:mod:`spark_dist.horovod`). Each rank is a process of tests/scripts/horovod_upstream/rank_main.py with the environment
:func:`tests.unit.horovod_ranks.horovod_job` gives it (what spark_dist's Horovod backend gives a rank).

``python -m tests.unit.horovod_suite_ranks [TEST NAMES...]`` (from the repository root) runs test_torch.py (all
of it, or the tests named) with both implementations and prints each test's outcomes and the counts.
"""
import collections
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time

import torch

from tests.unit.horovod_ranks import horovod_job

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE_DIR = os.path.join(REPO, "tests", "scripts", "horovod_upstream")
RANK_MAIN = os.path.join(SUITE_DIR, "rank_main.py")
_spec = importlib.util.spec_from_file_location("horovod_suite_rank_main", RANK_MAIN)
rank_main = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rank_main)
TEST_FILE = rank_main.TEST_FILE
EXAMPLES = os.path.join(SUITE_DIR, "examples", "pytorch")
IMPLS = ("horovod", "spark_dist")
WORLD = 2
_PEERS_GONE = 3  # seconds the other ranks get to leave after one has
_RETRIES = 2  # of a test in which a job ended (see run_test_torch)
# Tests of test_torch.py that pass with Horovod and fail with spark_dist.horovod by design, with what ours raises
# there (tests/unit/test_horovod_own_suite.py's docstring has the table). Each leaves the ranks out of step (one
# rank fails halfway), so it runs in a job of its own.
BY_ORDER = "Mismatched operations: One rank did an {}, but another rank did an BARRIER."
INTENDED_DIFFERENCES = {
    f"test_horovod_{op.lower()}_duplicate_name_error": BY_ORDER.format(op)
    for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "REDUCESCATTER")
}


def run_job(impl, mode_args, workdir, timeout, stall=None, env=None):
    """The ranks of one job: ``rank_main.py IMPL OUT *mode_args`` in each, OUT being ``workdir/out.<rank>``.
    Waits until every rank has exited, ``timeout`` seconds have passed, (``stall``) no rank has written to its
    OUT for that many seconds, or a rank has been gone for ``_PEERS_GONE`` seconds (its peers then wait for it
    in vain); then kills what still runs. ``env``: more variables for every rank. Returns each rank's exit code
    (None: killed here; negative: the signal that ended it), by rank; each rank's output is in
    ``workdir/log.<rank>``."""
    os.makedirs(workdir, exist_ok=True)
    outs = [os.path.join(workdir, f"out.{r}") for r in range(WORLD)]
    procs = []
    with horovod_job(impl, ["127.0.0.1"] * WORLD) as envs:
        try:
            for r in range(WORLD):
                rank_env = dict(os.environ, **envs[r], **(env or {}))
                rank_env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (REPO, SUITE_DIR, rank_env.get("PYTHONPATH")) if p)
                with open(os.path.join(workdir, f"log.{r}"), "ab") as log:
                    procs.append(subprocess.Popen([sys.executable, RANK_MAIN, impl, outs[r], *mode_args], env=rank_env,
                                                  cwd=workdir, stdout=log, stderr=subprocess.STDOUT))
            start = last_change = time.monotonic()
            sizes, first_exit = None, None
            while any(p.poll() is None for p in procs):
                now_sizes = [os.path.getsize(o) if os.path.exists(o) else -1 for o in outs]
                now = time.monotonic()
                if now_sizes != sizes:
                    sizes, last_change = now_sizes, now
                if first_exit is None and any(p.poll() is not None for p in procs):
                    first_exit = now
                if now - start > timeout or stall is not None and now - last_change > stall or \
                        first_exit is not None and now - first_exit > _PEERS_GONE:
                    break
                time.sleep(0.1)
        finally:
            killed = [p.poll() is None for p in procs]
            for p, kill in zip(procs, killed):
                if kill:
                    p.kill()
                p.wait()
    return [None if kill else p.returncode for p, kill in zip(procs, killed)]


def _events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _combine(per_rank):
    """One outcome from every rank's ``(outcome, message, seconds)``: theirs when all agree, else ``failed``;
    the seconds of the slowest rank."""
    outcomes = {outcome for outcome, _, _ in per_rank}
    seconds = max(s for _, _, s in per_rank)
    if len(outcomes) == 1 and "failed" not in outcomes:
        return per_rank[0][0], per_rank[0][1], seconds
    return "failed", " | ".join(f"rank {r}: {o}: {m}" for r, (o, m, _) in enumerate(per_rank) if o != "passed"), \
        seconds


def _node(name):
    return f"{TEST_FILE}::TorchTests::{name}"


def run_test_torch(impl, workdir, names=None, isolated=(), hide_muon=False, stall=60, timeout=1800):
    """Horovod's test_torch.py with ``impl`` on 2 ranks: the tests ``names`` in that order (default: all, in the
    file's order) in one job; the tests of ``isolated`` among them in a job each, after it (tests after which
    ranks may be out of step: a rank that failed halfway leaves the others' collectives unpaired).
    ``hide_muon``: see rank_main.py's ``_hide_muon``.

    Returns:
        ``{test name: (outcome, message, seconds)}``: ``passed``, ``skipped`` or ``failed`` (on any rank, with
        what each rank said). When the job gets stuck in a test (nothing for ``stall`` seconds) or a rank dies,
        a new job runs the tests after it, starting with that test again (real Horovod's ``init()`` now
        and then times out connecting to a peer, at an address its HTTP rendezvous kept from the previous init,
        in one of the file's hundred init/shutdown cycles: more often on a busy machine); a test that ends a
        job ``_RETRIES + 1`` times is ``failed``.
    """
    env = {rank_main.HIDE_MUON_ENV: "1"} if hide_muon else {}
    relative = os.path.relpath(TEST_FILE, SUITE_DIR)  # pytest's node ids start from its rootdir, SUITE_DIR
    deselect = [a for n in isolated for a in ("--deselect", f"{relative}::TorchTests::{n}")]
    main = [_node(n) for n in names if n not in isolated] if names else [TEST_FILE, *deselect]
    jobs = ([main] if main else []) + [[_node(n)] for n in isolated if not names or n in names]
    results, retried = {}, collections.Counter()
    for attempt in itertools.count():
        if not jobs:
            return results
        job_dir = os.path.join(workdir, f"{impl}.{attempt}")
        codes = run_job(impl, ["pytest", *jobs.pop(0)], job_dir, timeout, stall, env)
        events = [_events(os.path.join(job_dir, f"out.{r}")) for r in range(WORLD)]
        collected = next((e["collected"] for e in events[0] if "collected" in e), None)
        if collected is None:
            raise AssertionError(f"{impl}: no test collected; see {job_dir}/log.*")
        done = [{e["test"].rsplit("::", 1)[1]: (e["outcome"], e["message"], e["seconds"]) for e in rank
                 if "test" in e} for rank in events]
        order = [c.rsplit("::", 1)[1] for c in collected]
        for i, name in enumerate(order):
            if not all(name in d for d in done):  # the job ended inside this test: stuck, or a rank died
                why = f"exit codes {codes}, None: stuck until killed"
                results[name] = ("failed", f"the job ended in this test ({why}); see {job_dir}/log.*", None)
                retried[name] += 1
                rest = order[i:] if retried[name] <= _RETRIES else order[i + 1:]  # once more (see above)
                if rest:
                    jobs.insert(0, [_node(n) for n in rest])
                break
            results[name] = _combine([d[name] for d in done])


def run_example(impl, script, script_args, workdir, seed=42, timeout=300):
    """One of Horovod's examples/pytorch scripts, unchanged, under tests/scripts/horovod_upstream/examples_shim.py on 2
    ranks; returns each rank's record (``losses``: every loss the script computed, in order; ``weights``: the
    final parameters of its DistributedOptimizer; ``steps``)."""
    codes = run_job(impl, ["example", str(seed), os.path.join(EXAMPLES, script), *script_args], workdir, timeout)
    if codes != [0] * WORLD:
        raise AssertionError(f"{impl} {script}: exit codes {codes}; see {workdir}/log.*")
    return [torch.load(os.path.join(workdir, f"out.{r}"), weights_only=False) for r in range(WORLD)]


def main(argv):
    import tempfile

    hide_muon = "--hide-muon" in argv
    names = [a for a in argv if a != "--hide-muon"] or None
    workdir = tempfile.mkdtemp(prefix="horovod-own-suite-")
    results = {}
    for impl in IMPLS:
        began = time.monotonic()
        results[impl] = run_test_torch(impl, workdir, names, INTENDED_DIFFERENCES, hide_muon)
        print(f"{impl}: {time.monotonic() - began:.0f} s", flush=True)
    for name in results["horovod"]:
        row = [results[impl].get(name, ("-", "", None)) for impl in IMPLS]
        print(f"{name:55} " + " ".join(f"{o:8} {s if s is not None else '-':>7}" for o, _, s in row))
        for impl, (outcome, message, _) in zip(IMPLS, row):
            if outcome == "failed":
                print(f"    {impl}: {message[:600]}")
    for impl in IMPLS:
        counts = {o: sum(1 for v, _, _ in results[impl].values() if v == o) for o in ("passed", "failed", "skipped")}
        print(impl, counts)
    print("logs:", workdir)


if __name__ == "__main__":
    main(sys.argv[1:])
