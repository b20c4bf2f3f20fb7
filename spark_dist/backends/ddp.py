"""PyTorch DDP: ranks call ``init_process_group()`` themselves (as under torchrun and TorchDistributor);
the torchrun variables point them at the driver's store, so nothing else is needed here."""
from .base import Backend


class DDPBackend(Backend):
    name = "ddp"
