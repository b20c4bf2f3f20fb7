"""The transforms Horovod's MNIST example composes, for the images of :mod:`.datasets` (HxW uint8 arrays)."""
import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class ToTensor:
    """An HxW uint8 array to a 1xHxW float tensor in [0, 1], as torchvision's."""

    def __call__(self, image):
        return torch.from_numpy(image).unsqueeze(0).float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std
