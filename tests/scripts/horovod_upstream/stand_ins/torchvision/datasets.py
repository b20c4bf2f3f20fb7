"""``MNIST``: deterministic generated 28x28 digits in place of the real data set (see :class:`MNIST`)."""
import numpy as np

TRAIN_SIZE = 512
TEST_SIZE = 200


class MNIST:
    """What ``torchvision.datasets.MNIST(root, train, transform, download)`` gives a script, on generated data:
    ``TRAIN_SIZE`` (or ``TEST_SIZE``) uint8 images of 28x28 as numpy arrays (each a fixed pattern of its label plus
    noise, from a fixed seed: the same on every rank and run) and int labels; ``root`` and ``download`` are
    accepted and unused. Real torchvision's transforms take these images too."""

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        draw = np.random.default_rng(20240601 if train else 20240602)
        patterns = np.random.default_rng(7).integers(0, 160, size=(10, 28, 28))
        size = TRAIN_SIZE if train else TEST_SIZE
        self.targets = draw.integers(0, 10, size=size)
        noise = draw.integers(0, 96, size=(size, 28, 28))
        self.data = (patterns[self.targets] + noise).astype(np.uint8)
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        image, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
