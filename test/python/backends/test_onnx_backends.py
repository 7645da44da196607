"""ort and openvino backends: the ONNX export of real model-zoo shapes against IREE alone, within each
backend's documented tolerance (rtol 1e-4, atol 5e-4), plus random plans over every backend.

Shapes: ResNet-50 3x3 conv (1x64x56x56), its strided 1x1 downsample, a MobileNetV2 depthwise conv
(stride 2, asymmetric padding), an NHWC conv, max pooling, BERT-base matmuls (128x768x768, attention
batch matmuls, non-leading batch dims), softmax, layer norm, reductions, and concat/slice/pad/
transpose/select/compare/convert/clamp/iota. Torch models bring ``dense_resource`` weights.
"""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.backends import get_backend
from collage_mlir.frontends.torch import import_torch
from collage_mlir.ir import new_context, parse_module

BACKENDS = {"ort": "onnxruntime", "openvino": "openvino"}

ZOO = """
func.func @resnet_conv3x3(%x: tensor<1x64x56x56xf32>, %w: tensor<64x64x3x3xf32>) -> tensor<1x64x56x56xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x64x56x56xf32>, tensor<64x64x3x3xf32>) -> tensor<1x64x56x56xf32>
  %z = stablehlo.constant dense<0.0> : tensor<1x64x56x56xf32>
  %1 = stablehlo.maximum %0, %z : tensor<1x64x56x56xf32>
  return %1 : tensor<1x64x56x56xf32>
}
func.func @resnet_strided_1x1(%x: tensor<1x256x56x56xf32>, %w: tensor<512x256x1x1xf32>, %b: tensor<512xf32>) -> tensor<1x512x28x28xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [2, 2], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x256x56x56xf32>, tensor<512x256x1x1xf32>) -> tensor<1x512x28x28xf32>
  %1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<512xf32>) -> tensor<1x512x28x28xf32>
  %2 = stablehlo.add %0, %1 : tensor<1x512x28x28xf32>
  return %2 : tensor<1x512x28x28xf32>
}
func.func @mobilenet_depthwise(%x: tensor<1x144x56x56xf32>, %w: tensor<144x1x3x3xf32>) -> tensor<1x144x28x28xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [2, 2], pad = [[0, 1], [0, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 144 : i64} : (tensor<1x144x56x56xf32>, tensor<144x1x3x3xf32>) -> tensor<1x144x28x28xf32>
  %lo = stablehlo.constant dense<0.0> : tensor<f32>
  %hi = stablehlo.constant dense<6.0> : tensor<f32>
  %1 = stablehlo.clamp %lo, %0, %hi : (tensor<f32>, tensor<1x144x28x28xf32>, tensor<f32>) -> tensor<1x144x28x28xf32>
  return %1 : tensor<1x144x28x28xf32>
}
func.func @nhwc_conv(%x: tensor<1x28x28x32xf32>, %w: tensor<3x3x32x64xf32>) -> tensor<1x28x28x64xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x28x28x32xf32>, tensor<3x3x32x64xf32>) -> tensor<1x24x24x64xf32>
  %p = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.pad %0, %p, low = [0, 2, 2, 0], high = [0, 2, 2, 0], interior = [0, 0, 0, 0] : (tensor<1x24x24x64xf32>, tensor<f32>) -> tensor<1x28x28x64xf32>
  return %1 : tensor<1x28x28x64xf32>
}
func.func @nhwc_depthwise(%x: tensor<1x28x28x32xf32>, %w: tensor<3x3x1x32xf32>) -> tensor<1x14x14x32xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[0, 1], [0, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 32 : i64} : (tensor<1x28x28x32xf32>, tensor<3x3x1x32xf32>) -> tensor<1x14x14x32xf32>
  %c0 = stablehlo.constant dense<0.0> : tensor<1x14x14x32xf32>
  %c6 = stablehlo.constant dense<6.0> : tensor<1x14x14x32xf32>
  %1 = stablehlo.clamp %c0, %0, %c6 : tensor<1x14x14x32xf32>
  return %1 : tensor<1x14x14x32xf32>
}
func.func @max_pool(%x: tensor<1x64x112x112xf32>) -> tensor<1x64x56x56xf32> {
  %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = "stablehlo.reduce_window"(%x, %m) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %r = stablehlo.maximum %a, %b : tensor<f32>
      stablehlo.return %r : tensor<f32>
  }) {window_dimensions = array<i64: 1, 1, 3, 3>, window_strides = array<i64: 1, 1, 2, 2>, padding = dense<[[0, 0], [0, 0], [1, 1], [1, 1]]> : tensor<4x2xi64>} : (tensor<1x64x112x112xf32>, tensor<f32>) -> tensor<1x64x56x56xf32>
  return %0 : tensor<1x64x56x56xf32>
}
func.func @nhwc_sum_pool(%x: tensor<1x28x28x16xf32>) -> (tensor<1x14x14x16xf32>, tensor<1x14x14x16xf32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = "stablehlo.reduce_window"(%x, %z) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %r = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %r : tensor<f32>
  }) {window_dimensions = array<i64: 1, 3, 3, 1>, window_strides = array<i64: 1, 2, 2, 1>, padding = dense<[[0, 0], [1, 1], [1, 1], [0, 0]]> : tensor<4x2xi64>} : (tensor<1x28x28x16xf32>, tensor<f32>) -> tensor<1x14x14x16xf32>
  %1 = "stablehlo.reduce_window"(%x, %z) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %r = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %r : tensor<f32>
  }) {window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>} : (tensor<1x28x28x16xf32>, tensor<f32>) -> tensor<1x14x14x16xf32>
  %q = stablehlo.constant dense<4.0> : tensor<1x14x14x16xf32>
  %2 = stablehlo.divide %1, %q : tensor<1x14x14x16xf32>
  return %0, %2 : tensor<1x14x14x16xf32>, tensor<1x14x14x16xf32>
}
func.func @bert_matmul(%a: tensor<128x768xf32>, %w: tensor<768x768xf32>) -> tensor<128x768xf32> {
  %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<768x768xf32>) -> tensor<768x768xf32>
  %0 = stablehlo.dot_general %a, %t, contracting_dims = [1] x [0] : (tensor<128x768xf32>, tensor<768x768xf32>) -> tensor<128x768xf32>
  return %0 : tensor<128x768xf32>
}
func.func @attention_bmm(%q: tensor<12x128x64xf32>, %k: tensor<12x128x64xf32>) -> tensor<12x128x128xf32> {
  %0 = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<12x128x64xf32>, tensor<12x128x64xf32>) -> tensor<12x128x128xf32>
  return %0 : tensor<12x128x128xf32>
}
func.func @dot_inner_batch(%a: tensor<64x4x32xf32>, %b: tensor<32x4x16xf32>) -> tensor<4x64x16xf32> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [1] x [1], contracting_dims = [2] x [0] : (tensor<64x4x32xf32>, tensor<32x4x16xf32>) -> tensor<4x64x16xf32>
  return %0 : tensor<4x64x16xf32>
}
func.func @softmax(%x: tensor<12x128x128xf32>) -> tensor<12x128x128xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [2] : (tensor<12x128x128xf32>, tensor<f32>) -> tensor<12x128xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] : (tensor<12x128xf32>) -> tensor<12x128x128xf32>
  %2 = stablehlo.subtract %x, %1 : tensor<12x128x128xf32>
  %3 = stablehlo.exponential %2 : tensor<12x128x128xf32>
  %4 = stablehlo.reduce(%3 init: %zero) applies stablehlo.add across dimensions = [2] : (tensor<12x128x128xf32>, tensor<f32>) -> tensor<12x128xf32>
  %5 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<12x128xf32>) -> tensor<12x128x128xf32>
  %6 = stablehlo.divide %3, %5 : tensor<12x128x128xf32>
  return %6 : tensor<12x128x128xf32>
}
func.func @layer_norm(%x: tensor<128x768xf32>, %g: tensor<768xf32>, %b: tensor<768xf32>) -> tensor<128x768xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %n = stablehlo.constant dense<768.0> : tensor<128xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<128x1xf32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<128x768xf32>, tensor<f32>) -> tensor<128xf32>
  %1 = stablehlo.divide %0, %n : tensor<128xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<128xf32>) -> tensor<128x768xf32>
  %3 = stablehlo.subtract %x, %2 : tensor<128x768xf32>
  %4 = stablehlo.multiply %3, %3 : tensor<128x768xf32>
  %5 = stablehlo.reduce(%4 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<128x768xf32>, tensor<f32>) -> tensor<128xf32>
  %6 = stablehlo.divide %5, %n : tensor<128xf32>
  %7 = stablehlo.reshape %6 : (tensor<128xf32>) -> tensor<128x1xf32>
  %8 = stablehlo.add %7, %eps : tensor<128x1xf32>
  %9 = stablehlo.rsqrt %8 : tensor<128x1xf32>
  %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x768xf32>
  %11 = stablehlo.multiply %3, %10 : tensor<128x768xf32>
  %12 = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<768xf32>) -> tensor<128x768xf32>
  %13 = stablehlo.multiply %11, %12 : tensor<128x768xf32>
  %14 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<768xf32>) -> tensor<128x768xf32>
  %15 = stablehlo.add %13, %14 : tensor<128x768xf32>
  return %15 : tensor<128x768xf32>
}
func.func @reductions(%x: tensor<8x64x32xf32>) -> (tensor<64xf32>, tensor<8x32xf32>, tensor<8xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  %big = stablehlo.constant dense<0x7F800000> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %one) applies stablehlo.add across dimensions = [0, 2] : (tensor<8x64x32xf32>, tensor<f32>) -> tensor<64xf32>
  %1 = stablehlo.reduce(%x init: %big) applies stablehlo.minimum across dimensions = [1] : (tensor<8x64x32xf32>, tensor<f32>) -> tensor<8x32xf32>
  %a = stablehlo.abs %x : tensor<8x64x32xf32>
  %s = stablehlo.sqrt %a : tensor<8x64x32xf32>
  %2 = stablehlo.reduce(%s init: %zero) applies stablehlo.maximum across dimensions = [1, 2] : (tensor<8x64x32xf32>, tensor<f32>) -> tensor<8xf32>
  return %0, %1, %2 : tensor<64xf32>, tensor<8x32xf32>, tensor<8xf32>
}
func.func @data_movement(%x: tensor<4x16x8xf32>, %y: tensor<4x16x8xf32>) -> (tensor<16x8x4xf32>, tensor<4x8x8xf32>, tensor<8x16x8xf32>) {
  %0 = stablehlo.concatenate %x, %y, dim = 0 : (tensor<4x16x8xf32>, tensor<4x16x8xf32>) -> tensor<8x16x8xf32>
  %1 = stablehlo.slice %0 [2:6, 1:16:2, 0:8] : (tensor<8x16x8xf32>) -> tensor<4x8x8xf32>
  %2 = stablehlo.transpose %x, dims = [1, 2, 0] : (tensor<4x16x8xf32>) -> tensor<16x8x4xf32>
  %r = stablehlo.concatenate %y, %x, dim = 0 : (tensor<4x16x8xf32>, tensor<4x16x8xf32>) -> tensor<8x16x8xf32>
  %3 = stablehlo.compare GT, %0, %r : (tensor<8x16x8xf32>, tensor<8x16x8xf32>) -> tensor<8x16x8xi1>
  %4 = stablehlo.select %3, %0, %r : tensor<8x16x8xi1>, tensor<8x16x8xf32>
  %i = stablehlo.iota dim = 1 : tensor<8x16x8xi32>
  %f = stablehlo.convert %i : (tensor<8x16x8xi32>) -> tensor<8x16x8xf32>
  %5 = stablehlo.add %4, %f : tensor<8x16x8xf32>
  %n = stablehlo.negate %5 : tensor<8x16x8xf32>
  %t = stablehlo.tanh %n : tensor<8x16x8xf32>
  %l = stablehlo.logistic %t : tensor<8x16x8xf32>
  return %2, %1, %l : tensor<16x8x4xf32>, tensor<4x8x8xf32>, tensor<8x16x8xf32>
}
"""

CASES = {
    "resnet_conv3x3": [(1, 64, 56, 56), (64, 64, 3, 3)],
    "resnet_strided_1x1": [(1, 256, 56, 56), (512, 256, 1, 1), (512,)],
    "mobilenet_depthwise": [(1, 144, 56, 56), (144, 1, 3, 3)],
    "nhwc_conv": [(1, 28, 28, 32), (3, 3, 32, 64)],
    "nhwc_depthwise": [(1, 28, 28, 32), (3, 3, 1, 32)],  # JAX's depthwise conv (HWIO, feature groups), relu6
    "max_pool": [(1, 64, 112, 112)],
    "nhwc_sum_pool": [(1, 28, 28, 16)],  # JAX's average pooling: a zero-init sum window (padded), then / size
    "bert_matmul": [(128, 768), (768, 768)],
    "attention_bmm": [(12, 128, 64), (12, 128, 64)],
    "dot_inner_batch": [(64, 4, 32), (32, 4, 16)],
    "softmax": [(12, 128, 128)],
    "layer_norm": [(128, 768), (768,), (768,)],
    "reductions": [(8, 64, 32)],
    "data_movement": [(4, 16, 8), (4, 16, 8)],
}


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend(request):
    pytest.importorskip("onnx")
    pytest.importorskip(BACKENDS[request.param])
    return request.param


def _run(out_dir, fn, args):
    with collage_runtime.load(out_dir) as prog:
        return [np.asarray(y) for y in prog.invoke(fn, *args)]


@pytest.fixture(scope="module")
def zoo_reference(tmp_path_factory):
    """The zoo compiled by IREE alone, loaded once."""
    art = compile_module(parse_module(ZOO, new_context()), "default", tmp_path_factory.mktemp("zoo-ref"))
    with collage_runtime.load(art.out_dir) as prog:
        yield prog


@pytest.fixture(scope="module")
def zoo_mixed(backend, tmp_path_factory):
    """(ops left outside regions per function, manifest, loaded program) of the zoo with every op
    the backend takes placed on it."""
    module = parse_module(ZOO, new_context())
    art = compile_module(module, f"prefer:{backend}", tmp_path_factory.mktemp(backend))  # partitions in place
    left = {}
    for func in module.body.operations:
        if not func.regions or not len(func.regions[0].blocks):
            continue  # a collage_rt.* declaration
        ops = [o.operation.name for o in func.regions[0].blocks[0].operations]
        left[str(func.attributes["sym_name"]).strip('"')] = [
            n for n in ops if n not in ("func.call", "func.return", "stablehlo.constant", "arith.constant", "stablehlo.iota")]
    with collage_runtime.load(art.out_dir) as prog:
        yield left, art.manifest, prog


@pytest.mark.parametrize("fn", sorted(CASES))
def test_zoo_shapes_match_iree(fn, backend, zoo_mixed, zoo_reference):
    tol = get_backend(backend).tolerance
    left, manifest, prog = zoo_mixed
    # Every op of every function is supported: the whole computation runs in the backend's regions.
    assert left[fn] == [], f"ops left to IREE in {fn}: {left[fn]}"
    assert {r.backend for r in manifest.regions} == {backend}
    rng = np.random.default_rng(0)
    args = [np.asarray(rng.standard_normal(s), dtype=np.float32) for s in CASES[fn]]
    got = [np.asarray(y) for y in prog.invoke(fn, *args)]
    want = [np.asarray(y) for y in zoo_reference.invoke(fn, *args)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol.rtol, atol=tol.atol)


def _torch_models():
    import torch
    from torch import nn

    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                        nn.MaxPool2d(3, 2, 1), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU6(),
                        nn.Flatten(), nn.Linear(16 * 8 * 8, 10)).eval()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192)
            self.norm = nn.LayerNorm(64)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            att = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
            return self.norm(x + torch.tanh(att @ v))

    return {"cnn": (cnn, (1, 3, 32, 32)), "block": (Block().eval(), (2, 16, 64))}


@pytest.fixture(scope="module")
def torch_references(torch, tmp_path_factory):
    """Per torch model: (model, input, IREE-alone output), compiled once for both backends."""
    refs = {}
    for name, (build, shape) in _torch_models().items():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        out = tmp_path_factory.mktemp(f"{name}-ref")
        compile_module(import_torch(build, [x], new_context()), "default", out)
        (y,) = _run(out, "main", [x.numpy()])
        with torch.no_grad():
            np.testing.assert_allclose(y, build(x).numpy(), rtol=1e-3, atol=1e-4)  # sanity: IREE == torch
        refs[name] = (build, x, y)
    return refs


@pytest.mark.parametrize("model", ["cnn", "block"])
def test_torch_models_match_iree(model, backend, torch_references, tmp_path):
    """Weights arrive as dense_resource constants; softmax and layer norm as torch-mlir writes them."""
    build, x, want = torch_references[model]
    mixed = compile_module(import_torch(build, [x], new_context()), f"prefer:{backend}", tmp_path)
    assert any(r.backend == backend for r in mixed.manifest.regions)
    tol = get_backend(backend).tolerance
    (got,) = _run(mixed.out_dir, "main", [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=tol.rtol, atol=tol.atol)

# Random plans over every backend, these two included, are test_numerics.py's job.
