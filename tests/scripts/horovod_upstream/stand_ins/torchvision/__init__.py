"""A stand-in for torchvision, which this project's environments do not install, for Horovod's PyTorch examples
(examples_shim.py puts its folder first on ``sys.path`` only where torchvision is absent): ``datasets.MNIST``
gives generated images (nothing can be downloaded), ``transforms`` the two the MNIST example composes, and
``models`` one small image classifier for the synthetic benchmark's ``--model``. Not torchvision's API beyond
what those scripts call."""
from . import datasets, models, transforms  # noqa: F401
