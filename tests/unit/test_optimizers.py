"""spark_dist.ml.optimizers: the estimator's optimizers by name on CPU, torch's functional ones, update weights exactly
as torch.optim's classes do; which path a fit takes (spark_dist.ml.training.training_path)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from spark_dist.ml import optimizers
from spark_dist.ml.training import make_optimizer, training_path

TORCH_OPTIM = {"adam": lambda p, lr: torch.optim.Adam(p, lr=lr), "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr),
               "sgd": lambda p, lr: torch.optim.SGD(p, lr=lr)}


def trained_weights(make_optimizer_of, steps=60, resume_at=None):
    """A small model trained from the same start on the same batches, the learning rate changed between steps
    as the estimator's warm-up changes it, and its last layer left out of every fifth step (no gradient).
    ``resume_at``: after that step, the model and optimizer go on from a copy of their state dicts, in new
    objects, as a fit retried from its checkpoint does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4), torch.nn.Linear(4, 4))
    optimizer = make_optimizer_of(model.parameters(), 0.01)
    batches = torch.Generator().manual_seed(1)
    for step in range(steps):
        if step == resume_at:
            saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
            model = torch.nn.Sequential(*(copy.deepcopy(layer) for layer in model))
            model.load_state_dict(saved["model"])
            optimizer = make_optimizer_of(model.parameters(), 0.5)
            optimizer.load_state_dict(saved["optimizer"])
        for group in optimizer.param_groups:
            group["lr"] = 0.01 * (1 + step % 3)
        x, y = torch.randn(8, 16, generator=batches), torch.randint(0, 4, (8,), generator=batches)
        optimizer.zero_grad()
        F.cross_entropy(model[:3](x) if step % 5 == 0 else model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("name", sorted(optimizers.BY_NAME))
def test_each_name_trains_bit_for_bit_as_torch_optim_does(name):
    ours = trained_weights(optimizers.BY_NAME[name])
    theirs = trained_weights(TORCH_OPTIM[name])
    start = trained_weights(TORCH_OPTIM[name], steps=0)
    assert not torch.equal(ours, start)  # it trained
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", sorted(optimizers.BY_NAME))
def test_each_goes_on_from_its_state_dict_bit_for_bit(name):
    assert torch.equal(trained_weights(optimizers.BY_NAME[name], resume_at=23),
                       trained_weights(optimizers.BY_NAME[name]))


def test_the_estimator_takes_them_only_for_named_optimizers_on_cpu_replicas():
    model = torch.nn.Linear(4, 2)
    assert isinstance(make_optimizer("adam", model.parameters(), 0.1, functional=True), optimizers.Adam)
    assert isinstance(make_optimizer("adam", model.parameters(), 0.1), torch.optim.Adam)  # DDP imports torch._dynamo
    mine = make_optimizer(lambda params, lr: torch.optim.RMSprop(params, lr=lr), model.parameters(), 0.1,
                          functional=True)
    assert isinstance(mine, torch.optim.RMSprop)  # a callable is the user's own
    halves = torch.nn.Linear(4, 2).to(torch.complex64)
    assert not optimizers.serves(list(halves.parameters()))  # torch.optim views complex weights as real pairs
    assert isinstance(make_optimizer("sgd", halves.parameters(), 0.1, functional=True), torch.optim.SGD)


def test_the_path_a_fit_takes():
    small, large = torch.nn.Linear(64, 10), torch.nn.Linear(1024, 512)  # 2.6 KB and 2 MB of gradients
    assert training_path(small, "adam", "ddp", use_gpu=False) == {
        "ranks": "replicas", "gradients": "one all-reduce of all gradients after backward (as DDP's one bucket), "
                                          "no DDP", "optimizer": "torch.optim.adam.adam (functional)"}
    assert training_path(small, lambda p, lr: None, "ddp", use_gpu=False)["optimizer"] == "callable"
    assert training_path(large, "sgd", "ddp", use_gpu=False) == {
        "ranks": "ddp", "gradients": "DDP bucketed all-reduce (gloo)", "optimizer": "torch.optim.SGD"}
    assert training_path(small, "adamw", "ddp", use_gpu=True)["gradients"] == "DDP bucketed all-reduce (nccl)"
    assert training_path(small, "adam", "horovod", use_gpu=False)["ranks"] == "horovod"
