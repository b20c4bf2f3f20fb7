"""``tiny_convnet``: a small classifier of 3-channel images into 1000 classes, for the synthetic benchmark's
``--model tiny_convnet`` (its convolutions, batch norm (buffers that broadcast_parameters sends) and linear layer
cost a CPU rank little, where torchvision's ResNet-50 would take minutes)."""
from torch import nn


def tiny_convnet(num_classes=1000):
    return nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=7, stride=4), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, kernel_size=3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))
