"""A tensor that says it is on cuda:0 where no GPU exists, for the tests of results and checkpoints."""
import torch


class FakeCudaTensor(torch.Tensor):
    """Stands in for a CUDA tensor (no GPU here): says it is on cuda:0 and, pickled as it is, fails to load
    the way a CUDA storage does on a machine without a GPU. Its data really is on the CPU."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    device = property(lambda self: torch.device("cuda", 0))

    def __reduce_ex__(self, protocol):
        return (_load_on_a_machine_without_cuda, ())


def _load_on_a_machine_without_cuda():
    raise RuntimeError("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False")


def cuda_state_dict():
    weights = torch.arange(6.0).reshape(2, 3)
    return {"weight": FakeCudaTensor(weights), "bias": FakeCudaTensor(torch.ones(2)), "step": 7}
