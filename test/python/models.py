"""Small models built in code (random weights) for the numerics tests."""

from __future__ import annotations


def small_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4), nn.ReLU(),
        nn.Conv2d(16, 8, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    ).eval()


def mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)).eval()
