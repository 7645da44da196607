"""Model zoo: the benchmark models, built in code with seeded random weights (nothing downloaded), each
with a small variant for CI. PyTorch models (``nn.Module``) are imported to StableHLO through the torch
frontend, JAX models (``jax_*``: functions written as JAX users write them, ``jax_models.py``) through
the JAX frontend; both imports are cached on disk as bytecode, so ResNet-50's minutes-long import
happens once per machine.

    model, inputs = zoo.build("resnet50", small=False)       # (nn.Module, tensors) or (function, arrays)
    module = zoo.import_stablehlo("resnet50", context)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Callable

from ..errors import CollageError

#: Every build starts from this seed, so weights (and so the import cache key) are the same each time.
SEED = 0


class Framework(str, Enum):
    """What a zoo model is written in: what builds it, imports it and gives its reference outputs."""

    TORCH = "torch"  # (nn.Module, example tensors)
    JAX = "jax"      # (function, example numpy arrays): the function is what jax.jit compiles


@dataclass(frozen=True)
class ZooModel:
    """A benchmark model: full size and small (CI) builders of ``(model, example inputs)``."""

    name: str
    description: str
    small_description: str
    full: Callable[[], tuple]
    small: Callable[[], tuple]
    framework: Framework = Framework.TORCH


def _resnet(small: bool, groups: int = 1, width: int = 64):
    import torch

    from .resnet import ResNet

    if small:
        return ResNet((1, 1, 1, 1), groups, width, base=16, num_classes=10), (torch.randn(1, 3, 64, 64),)
    return ResNet((3, 4, 6, 3), groups, width), (torch.randn(1, 3, 224, 224),)


def _mobilenet(small: bool):
    import torch

    from .mobilenet import MobileNetV2

    if small:
        return MobileNetV2(width=0.25, num_classes=10), (torch.randn(1, 3, 64, 64),)
    return MobileNetV2(), (torch.randn(1, 3, 224, 224),)


def _bert(small: bool):
    from .transformer import bert, token_ids

    return (bert(2, 128, 2), (token_ids(32),)) if small else (bert(), (token_ids(128),))


def _gpt2(small: bool):
    from .transformer import gpt2, token_ids

    return (gpt2(2, 128, 2), (token_ids(32, 50257),)) if small else (gpt2(), (token_ids(128, 50257),))


def _dcgan(small: bool):
    import torch

    from .dcgan import Generator

    return (Generator(nz=16, ngf=8), (torch.randn(1, 16, 1, 1),)) if small else (Generator(), (torch.randn(1, 100, 1, 1),))


def _r3d(small: bool):
    import torch

    from .resnet import R3D

    if small:
        # 16 frames, as the full model: an 8-frame clip reaches a stride-2 conv on 2 frames, which
        # iree-compile 3.13 rejects ('linalg.generic' op inferred ... dimension #0 to be 4, but found 3).
        return R3D((1, 1, 1, 1), base=8, num_classes=10), (torch.randn(1, 3, 16, 32, 32),)
    return R3D(), (torch.randn(1, 3, 16, 112, 112),)


def _bf16(builder: Callable[[], tuple]) -> Callable[[], tuple]:
    """A PyTorch builder's model cast to bf16 as a PyTorch user casts it (``model.to(torch.bfloat16)``), its
    float inputs too."""
    def build():
        import torch

        model, inputs = builder()
        return model.to(torch.bfloat16), tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    return build


def _jax(builder: str, **kwargs) -> Callable[[], tuple]:
    def build():
        from . import jax_models

        return getattr(jax_models, builder)(**kwargs)
    return build


_JAX_MODELS = (
    ZooModel("jax_resnet50", "JAX ResNet-50 (NHWC, jax.nn), 1x224x224x3",
             "JAX ResNet (1,1,1,1) bottlenecks, width 16, 64x64",
             _jax("resnet", blocks=(3, 4, 6, 3), bottleneck=True),
             _jax("resnet", blocks=(1, 1, 1, 1), bottleneck=True, base=16, classes=10, image=64), Framework.JAX),
    ZooModel("jax_vit_b16", "JAX ViT-B/16, 1x224x224x3", "JAX ViT 2 layers, width 64, patch 8, 32x32",
             _jax("vit"), _jax("vit", image=32, patch=8, d=64, layers=2, heads=2, mlp=128, classes=10), Framework.JAX),
    ZooModel("jax_bert_base", "JAX BERT-base encoder, seq 128 (last 16 padding)", "JAX BERT 2 layers, width 64, seq 32",
             _jax("bert_encoder"), _jax("bert_encoder", seq=32, d=64, layers=2, heads=2, mlp=128, vocab=512),
             Framework.JAX),
    ZooModel("jax_lstm", "JAX 2-layer LSTM (lax.scan), 64 steps x 128 -> 256", "JAX LSTM 2 layers, 8 steps x 16 -> 32",
             _jax("lstm"), _jax("lstm", steps=8, features=16, hidden=32), Framework.JAX),
    ZooModel("jax_mobilenet_v2", "JAX MobileNetV2 1.0 (NHWC, depthwise as feature groups, relu6), 1x224x224x3",
             "JAX MobileNetV2 0.25, 64x64", _jax("mobilenet_v2"), _jax("mobilenet_v2", width=0.25, classes=10, image=64),
             Framework.JAX),
    ZooModel("jax_unet", "JAX U-Net (NHWC, 4 levels from width 32, conv_transpose up, bilinear resize), 1x128x128x3",
             "JAX U-Net 3 levels from width 8, 32x32", _jax("unet"), _jax("unet", image=32, base=8, depth=2),
             Framework.JAX),
    ZooModel("jax_detector", "JAX detector: ResNet backbone, top-100 + sort post-processing, 1x224x224x3",
             "JAX detector width 8, top-20, 64x64", _jax("detector"), _jax("detector", image=64, base=8, top=20),
             Framework.JAX),
    # As a JAX user casts them to bf16: weights and image (``jax_models``' ``dtype="bf16"``).
    ZooModel("jax_resnet50_bf16", "JAX ResNet-50 in bf16, 1x224x224x3", "JAX ResNet (1,1,1,1) bottlenecks in bf16, 64x64",
             _jax("resnet", blocks=(3, 4, 6, 3), bottleneck=True, dtype="bf16"),
             _jax("resnet", blocks=(1, 1, 1, 1), bottleneck=True, base=16, classes=10, image=64, dtype="bf16"),
             Framework.JAX),
    ZooModel("jax_mobilenet_v2_bf16", "JAX MobileNetV2 1.0 in bf16, 1x224x224x3", "JAX MobileNetV2 0.25 in bf16, 64x64",
             _jax("mobilenet_v2", dtype="bf16"), _jax("mobilenet_v2", width=0.25, classes=10, image=64, dtype="bf16"),
             Framework.JAX),
    ZooModel("jax_vit_b16_bf16", "JAX ViT-B/16 in bf16, 1x224x224x3", "JAX ViT 2 layers in bf16, width 64, 32x32",
             _jax("vit", dtype="bf16"),
             _jax("vit", image=32, patch=8, d=64, layers=2, heads=2, mlp=128, classes=10, dtype="bf16"), Framework.JAX),
    ZooModel("jax_bert_base_bf16", "JAX BERT-base encoder in bf16, seq 128", "JAX BERT 2 layers in bf16, width 64, seq 32",
             _jax("bert_encoder", dtype="bf16"),
             _jax("bert_encoder", seq=32, d=64, layers=2, heads=2, mlp=128, vocab=512, dtype="bf16"), Framework.JAX),
)

MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("resnet50", "ResNet-50, 1x3x224x224", "ResNet (1,1,1,1) blocks, width 16, 64x64",
             lambda: _resnet(False), lambda: _resnet(True)),
    ZooModel("resnext50_32x4d", "ResNeXt-50 32x4d, 1x3x224x224", "ResNeXt (1,1,1,1) blocks 32x4d, width 16, 64x64",
             lambda: _resnet(False, 32, 4), lambda: _resnet(True, 32, 4)),
    ZooModel("mobilenet_v2", "MobileNetV2 1.0, 1x3x224x224", "MobileNetV2 0.25, 64x64",
             lambda: _mobilenet(False), lambda: _mobilenet(True)),
    ZooModel("bert_base", "BERT-base (BertConfig()), seq 128", "BERT 2 layers, hidden 128, seq 32",
             lambda: _bert(False), lambda: _bert(True)),
    ZooModel("gpt2_small", "GPT-2 small (GPT2Config()), seq 128", "GPT-2 2 layers, hidden 128, seq 32",
             lambda: _gpt2(False), lambda: _gpt2(True)),
    ZooModel("dcgan", "DCGAN generator, 100x1x1 → 3x64x64", "DCGAN generator nz 16, ngf 8",
             lambda: _dcgan(False), lambda: _dcgan(True)),
    ZooModel("r3d_18", "R3D-18, 1x3x16x112x112 clip", "R3D (1,1,1,1) blocks, width 8, 16x32x32 clip",
             lambda: _r3d(False), lambda: _r3d(True)),
    ZooModel("resnet50_bf16", "ResNet-50 in bf16 (model.to(torch.bfloat16)), 1x3x224x224",
             "ResNet (1,1,1,1) blocks in bf16, width 16, 64x64", _bf16(lambda: _resnet(False)), _bf16(lambda: _resnet(True))),
    ZooModel("bert_base_bf16", "BERT-base in bf16 (model.to(torch.bfloat16)), seq 128", "BERT 2 layers in bf16, hidden 128, seq 32",
             _bf16(lambda: _bert(False)), _bf16(lambda: _bert(True))),
    *_JAX_MODELS,
)}


def get(name: str) -> ZooModel:
    """The zoo model called ``name``; an unknown name is one CollageError line listing the zoo."""
    if name not in MODELS:
        raise CollageError(f"unknown model '{name}' (the zoo has: {', '.join(MODELS)})")
    return MODELS[name]


def calibrate_batch_norm(model, inputs) -> None:
    """Sets every batch norm's running statistics from one pass over random data shaped like ``inputs``.
    With the default statistics (mean 0, variance 1) activations grow layer by layer and MobileNetV2's
    ReLU6 saturates: the output would not depend on the input, and a wrong engine could pass the check."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.momentum = None  # cumulative average: after one pass, exactly that pass's statistics
    model.train()
    with torch.no_grad():
        model(*[torch.randn_like(x) if x.is_floating_point() else x for x in inputs])
    model.eval()


def build(name: str, small: bool = False) -> tuple:
    """``(model, example inputs)``, seeded: the same weights and inputs on every call. A PyTorch model
    is an ``nn.Module`` in eval mode with tensors; a JAX model a function with numpy arrays."""
    entry = get(name)
    if entry.framework is Framework.JAX:
        fn, inputs = (entry.small if small else entry.full)()
        return fn, tuple(inputs)
    import torch

    torch.manual_seed(SEED)
    model, inputs = (entry.small if small else entry.full)()
    calibrate_batch_norm(model, inputs)
    return model.eval(), tuple(inputs)


def numpy_inputs(name: str, small: bool = False) -> list:
    """The model's example inputs as numpy arrays (what a compiled program takes)."""
    import numpy as np

    from ..frontends.torch import to_numpy

    _, inputs = build(name, small)
    return [np.asarray(to_numpy(x) if hasattr(x, "numpy") else x) for x in inputs]


def import_stablehlo(name: str, context, small: bool = False, cache=True):
    """The model as a StableHLO module in ``context`` (``@main``), from the on-disk import cache when there."""
    model, inputs = build(name, small)
    if get(name).framework is Framework.JAX:
        from ..frontends.jax import import_jax

        return import_jax(model, inputs, context, cache=cache)
    from ..frontends.torch import import_torch

    return import_torch(model, inputs, context, cache=cache)


@lru_cache(maxsize=None)
def flops(name: str, small: bool = False) -> float:
    """Floating-point operations of one inference (multiply-add = 2): for PyTorch models as torch's flop
    counter counts them (matmuls and convolutions; elementwise work is not counted), for JAX models by
    XLA's cost analysis of the lowered function (elementwise work included)."""
    model, inputs = build(name, small)
    if get(name).framework is Framework.JAX:
        import jax

        return float((jax.jit(model).lower(*inputs).cost_analysis() or {}).get("flops", 0.0))
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return float(counter.get_total_flops())
