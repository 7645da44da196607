"""onednn backend: every pattern against IREE alone, within its documented tolerance (rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import collage_runtime
from collage_mlir.artifact import compile_module
from collage_mlir.backends import get_backend
from collage_mlir.frontends.torch import import_torch
from collage_mlir.ir import new_context, parse_module

TOL = get_backend("onednn").tolerance

MATMULS = """
func.func @mm(%a: tensor<8x32xf32>, %b: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
func.func @mm_bt(%a: tensor<8x32xf32>, %b: tensor<16x32xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [1] : (tensor<8x32xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
func.func @bmm(%a: tensor<4x8x32xf32>, %b: tensor<4x32x16xf32>) -> tensor<4x8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x32xf32>, tensor<4x32x16xf32>) -> tensor<4x8x16xf32>
  return %0 : tensor<4x8x16xf32>
}
"""


def _conv_model(kind: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    conv = {
        "3x3": nn.Conv2d(8, 16, 3, padding=1),
        "strided-1x1": nn.Conv2d(8, 16, 1, stride=2),
        "grouped": nn.Conv2d(8, 16, 3, padding=1, groups=4),
        "depthwise": nn.Conv2d(8, 8, 3, padding=1, groups=8),
        "dilated": nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        "no-bias": nn.Conv2d(8, 8, 3, bias=False),
    }[kind]
    return nn.Sequential(conv, nn.ReLU()).eval()




@pytest.mark.parametrize("kind", ["3x3", "strided-1x1", "grouped", "depthwise", "dilated", "no-bias"])
def test_conv_pattern_matches_iree(kind, torch, tmp_path):
    x = torch.randn(1, 8, 14, 14, generator=torch.Generator().manual_seed(3))
    model = _conv_model(kind)
    mixed = compile_module(import_torch(model, [x], new_context()), "prefer:onednn", tmp_path / "mixed")
    alone = compile_module(import_torch(model, [x], new_context()), "default", tmp_path / "alone")
    (region,) = mixed.manifest["regions"]
    steps = json.loads((tmp_path / "mixed" / region["artifact"]).read_text())["steps"]
    assert [s["op"] for s in steps] == ["conv2d"] and steps[0]["act"] == "relu"  # bias and relu fused
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke("main", x.numpy())[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=TOL.rtol, atol=TOL.atol)


@pytest.mark.parametrize("fn, shapes", [("mm", [(8, 32), (32, 16)]), ("mm_bt", [(8, 32), (16, 32)]),
                                        ("bmm", [(4, 8, 32), (4, 32, 16)])])
def test_matmul_pattern_matches_iree(fn, shapes, tmp_path):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    mixed = compile_module(parse_module(MATMULS, new_context()), "prefer:onednn", tmp_path / "mixed")
    alone = compile_module(parse_module(MATMULS, new_context()), "default", tmp_path / "alone")
    assert len(mixed.manifest["regions"]) == 3
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke(fn, *args)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=TOL.rtol, atol=TOL.atol)
