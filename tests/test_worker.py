"""spark_dist.worker: how a task starts its rank. Forking the warm Python worker is the fast path; a worker
where forking is unsafe spawns a fresh interpreter instead."""
import sys

import torch

from spark_dist import worker


def test_a_worker_that_initialised_cuda_spawns_its_rank(monkeypatch):
    spawned = []
    monkeypatch.setattr(worker, "spawn_child", lambda *args: spawned.append(args) or "spawned")
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    # No GPU here: CUDA's "initialised" state stands in for a worker where a GPU transform ran.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert worker._unsafe_to_fork()
    assert worker.fork_child("spec", "rank", {}, "workdir") == "spawned"
    assert spawned == [("spec", "rank", {}, "workdir")]


def test_a_worker_that_imported_torch_dynamo_spawns_and_a_plain_one_forks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert not worker._unsafe_to_fork()
    monkeypatch.setitem(sys.modules, "torch._dynamo", object())
    assert worker._unsafe_to_fork()
