"""The operators of the per-operator study: every distinct convolution of ResNet-50, ResNeXt-50 32x4d
and MobileNetV2 (batch 1, 224x224, as torchvision builds them) and the matmuls of BERT-base at seq 128.
Derived from the architectures' stage tables, so no model download is needed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conv:
    model: str
    cin: int
    cout: int
    k: int
    stride: int
    hw: int  # input height = width
    groups: int = 1

    @property
    def name(self) -> str:
        g = f"g{self.groups}" if self.groups > 1 else ""
        return f"conv{self.k}x{self.k}s{self.stride}{g}_{self.cin}to{self.cout}_{self.hw}"

    @property
    def flops(self) -> float:
        out = (self.hw + 2 * (self.k // 2) - self.k) // self.stride + 1
        return 2.0 * out * out * self.cout * (self.cin // self.groups) * self.k * self.k


@dataclass(frozen=True)
class Matmul:
    model: str
    batch: int
    m: int
    k: int
    n: int

    @property
    def name(self) -> str:
        b = f"b{self.batch}_" if self.batch > 1 else ""
        return f"matmul_{b}{self.m}x{self.k}x{self.n}"

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n


def _bottlenecks(model: str, width: int, groups: int) -> list[Conv]:
    convs = [Conv(model, 3, 64, 7, 2, 224)]
    cin, hw = 64, 56
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        mid, out = planes * width // 64 * groups, planes * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            convs.append(Conv(model, cin, mid, 1, 1, hw))
            convs.append(Conv(model, mid, mid, 3, s, hw, groups))
            convs.append(Conv(model, mid, out, 1, 1, hw // s))
            if b == 0:
                convs.append(Conv(model, cin, out, 1, s, hw))
            cin, hw = out, hw // s
    return convs


def resnet50() -> list[Conv]:
    return _bottlenecks("resnet50", 64, 1)


def resnext50_32x4d() -> list[Conv]:
    return _bottlenecks("resnext50_32x4d", 4, 32)


def mobilenet_v2() -> list[Conv]:
    convs = [Conv("mobilenet_v2", 3, 32, 3, 2, 224)]
    cin, hw = 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for b in range(n):
            stride = s if b == 0 else 1
            hidden = cin * t
            if t != 1:
                convs.append(Conv("mobilenet_v2", cin, hidden, 1, 1, hw))
            convs.append(Conv("mobilenet_v2", hidden, hidden, 3, stride, hw, hidden))
            hw //= stride
            convs.append(Conv("mobilenet_v2", hidden, c, 1, 1, hw))
            cin = c
    convs.append(Conv("mobilenet_v2", 320, 1280, 1, 1, 7))
    return convs


def bert_base(seq: int = 128) -> list[Matmul]:
    return [
        Matmul("bert_base", 1, seq, 768, 768),  # Q, K, V and output projections
        Matmul("bert_base", 12, seq, 64, seq),  # attention scores
        Matmul("bert_base", 12, seq, seq, 64),  # attention x V
        Matmul("bert_base", 1, seq, 768, 3072),  # FFN up
        Matmul("bert_base", 1, seq, 3072, 768),  # FFN down
    ]


def unique(ops: list) -> list:
    """Distinct ops in first-seen order (a model repeats its block shapes)."""
    seen, out = set(), []
    for op in ops:
        key = op.name
        if key not in seen:
            seen.add(key)
            out.append(op)
    return out


MODELS = {"resnet50": resnet50, "resnext50_32x4d": resnext50_32x4d, "mobilenet_v2": mobilenet_v2,
          "bert_base": bert_base}
