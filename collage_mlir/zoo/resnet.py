"""Bottleneck ResNets (ResNet-50, ResNeXt-50 32x4d) and the R3D-18 video ResNet, laid out as torchvision
builds them (same layers, shapes and op order), written in plain ``torch.nn`` so no torchvision is needed."""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1 → 3x3 (grouped for ResNeXt) → 1x1 with a projection shortcut where the shape changes."""

    def __init__(self, cin: int, planes: int, stride: int, groups: int, width_per_group: int):
        super().__init__()
        mid, out = planes * width_per_group // 64 * groups, planes * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or cin != out else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


class ResNet(nn.Module):
    """7x7 stem, max pool, four bottleneck stages (``blocks`` per stage), global average pool, classifier."""

    def __init__(self, blocks=(3, 4, 6, 3), groups: int = 1, width_per_group: int = 64, base: int = 64,
                 num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], base
        for k, n in enumerate(blocks):
            planes = base * 2 ** k
            for b in range(n):
                layers.append(Bottleneck(cin, planes, 2 if b == 0 and k > 0 else 1, groups, width_per_group))
                cin = planes * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class BasicBlock3d(nn.Module):
    """Two 3x3x3 convolutions with a projection shortcut where the shape changes (R3D's block)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv3d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm3d(cout)
        self.conv2, self.bn2 = nn.Conv3d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm3d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + identity)


class R3D(nn.Module):
    """torchvision's r3d_18 layout: (3,7,7) stem with spatial stride 2, four stages of basic 3D blocks,
    global average pool, 400-way classifier."""

    def __init__(self, blocks=(2, 2, 2, 2), base: int = 64, num_classes: int = 400):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, base, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(base),
                                  nn.ReLU(inplace=True))
        layers, cin = [], base
        for k, n in enumerate(blocks):
            cout = base * 2 ** k
            for b in range(n):
                layers.append(BasicBlock3d(cin, cout, 2 if b == 0 and k > 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool3d(y, 1), 1))
