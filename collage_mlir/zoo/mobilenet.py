"""MobileNetV2 as torchvision builds it (inverted residuals, ReLU6, width multiplier), in plain ``torch.nn``."""

from __future__ import annotations

import torch
from torch import nn

#: (expansion t, output channels c, repeats n, first stride s) per stage, from the paper's table 2.
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of 8, never below 90% of ``v``."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True) -> list[nn.Module]:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6(inplace=True)] if act else layers


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        hidden = cin * t
        layers = _conv_bn(cin, hidden, 1, 1) if t != 1 else []
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden) + _conv_bn(hidden, cout, 1, 1, act=False)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        cin = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        layers = _conv_bn(3, cin, 3, 2)
        for t, c, n, s in SETTINGS:
            cout = _divisible(c * width)
            for b in range(n):
                layers.append(InvertedResidual(cin, cout, s if b == 0 else 1, t))
                cin = cout
        layers += _conv_bn(cin, last, 1, 1)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, num_classes)  # torchvision's dropout is the identity at inference

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))
