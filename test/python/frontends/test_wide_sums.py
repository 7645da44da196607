"""bf16/f16 sums accumulate in f32 (``frontends.wide_sums``), as torch computes them."""

import re

import numpy as np
import pytest

from collage_mlir.frontends import stablehlo, wide_sums
from collage_mlir.ir import new_context, parse_module

SUMS = """
func.func @main(%x: tensor<2x64xbf16>, %y: tensor<1x4x8x8xf16>, %z: tensor<2x64xf32>)
    -> (tensor<2xbf16>, tensor<2xbf16>, tensor<1x4x4x4xf16>, tensor<2xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<bf16>
  %low = stablehlo.constant dense<0xFF80> : tensor<bf16>
  %h0 = stablehlo.constant dense<0.0> : tensor<f16>
  %f0 = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1]
      : (tensor<2x64xbf16>, tensor<bf16>) -> tensor<2xbf16>
  %max = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [1]
      : (tensor<2x64xbf16>, tensor<bf16>) -> tensor<2xbf16>
  %pool = "stablehlo.reduce_window"(%y, %h0) <{window_dimensions = array<i64: 1, 1, 2, 2>,
      window_strides = array<i64: 1, 1, 2, 2>}> ({
    ^bb0(%a: tensor<f16>, %b: tensor<f16>):
      %s = stablehlo.add %a, %b : tensor<f16>
      stablehlo.return %s : tensor<f16>
  }) : (tensor<1x4x8x8xf16>, tensor<f16>) -> tensor<1x4x4x4xf16>
  %wide = stablehlo.reduce(%z init: %f0) applies stablehlo.add across dimensions = [1]
      : (tensor<2x64xf32>, tensor<f32>) -> tensor<2xf32>
  return %sum, %max, %pool, %wide : tensor<2xbf16>, tensor<2xbf16>, tensor<1x4x4x4xf16>, tensor<2xf32>
}
"""


@pytest.mark.fast
def test_narrow_sums_add_in_f32_and_nothing_else_changes():
    """The bf16 sum and the f16 window sum add f32 values and convert back (the function's types unchanged);
    the bf16 maximum and the f32 sum stay; a second run finds nothing left."""
    module = parse_module(SUMS, new_context())
    assert wide_sums.widen(module) == 2
    module.operation.verify()
    text = str(module)
    assert "(tensor<2x64xf32>, tensor<f32>) -> tensor<2xf32>" in text.split("maximum")[0]
    assert "applies stablehlo.maximum across dimensions = [1] : (tensor<2x64xbf16>, tensor<bf16>)" in text
    assert "(tensor<1x4x8x8xf32>, tensor<f32>) -> tensor<1x4x4x4xf32>" in text
    assert re.search(r"stablehlo.convert %\S+ : \(tensor<1x4x4x4xf32>\) -> tensor<1x4x4x4xf16>", text)
    assert re.search(r"stablehlo.convert %\S+ : \(tensor<2xf32>\) -> tensor<2xbf16>", text)
    assert text.count("(tensor<2x64xf32>, tensor<f32>) -> tensor<2xf32>") == 2  # the widened one and %wide
    assert "-> (tensor<2xbf16>, tensor<2xbf16>, tensor<1x4x4x4xf16>, tensor<2xf32>)" in text
    assert wide_sums.widen(module) == 0
    normalized = str(stablehlo.normalize(parse_module(SUMS, new_context())))  # every frontend's path widens
    assert "add across dimensions = [1] : (tensor<2x64xbf16>" in SUMS.replace("\n      :", " :")
    assert "add across dimensions = [1] : (tensor<2x64xbf16>" not in normalized


def test_a_bf16_global_average_pool_runs_as_torch_computes_it():
    """A bf16 CNN's global average pool (a sum of 32x32 values) through the torch frontend and IREE: within
    bf16's rounding of torch's own bf16 eager (IREE summed in bf16 before: 0.55 of the output's scale from the
    exact result)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.measure.reference import invoke_alone
    from collage_runtime.types import NUMPY_DTYPES

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    x = torch.randn(1, 3, 32, 32) + 1.0
    with torch.no_grad():
        exact = model(x).numpy()
        model = model.to(torch.bfloat16)
        eager = model(x.to(torch.bfloat16)).float().numpy()
    module = import_torch(model, [x.to(torch.bfloat16)], new_context(), cache=False)
    got = invoke_alone(module, {"main": [x.numpy().astype(NUMPY_DTYPES["bf16"])]})["main"][0]
    scale = np.abs(exact).max()
    assert np.abs(eager - exact).max() / scale < 0.01
    assert np.abs(np.asarray(got, np.float32) - exact).max() / scale < 0.01
