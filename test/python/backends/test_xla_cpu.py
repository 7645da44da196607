"""xla-cpu backend: model-zoo shaped regions run by XLA (jaxlib PJRT CPU) against IREE alone, within
the backend's documented tolerance; dense_resource weights inlined; i64 kept 64-bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

import collage_runtime  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.backends import get_backend  # noqa: E402
from collage_mlir.frontends.torch import import_torch  # noqa: E402
from collage_mlir.ir import new_context, parse_module  # noqa: E402

TOL = get_backend("xla-cpu").tolerance


def _run_both(make_module, fn: str, args: list[np.ndarray], tmp_path):
    """Compiles with everything preferred on xla-cpu and with IREE alone; returns (mixed result, IREE
    result, the mixed manifest's regions, their artifact texts)."""
    mixed = compile_module(make_module(), "prefer:xla-cpu", tmp_path / "mixed")
    alone = compile_module(make_module(), "default", tmp_path / "alone")
    regions = mixed.manifest.regions
    assert regions and all(r.backend == "xla-cpu" for r in regions)
    assert all(r.executor == "collage_runtime.executors.xla_pjrt" for r in regions)
    # bytecode (weights as raw bytes), or text where jaxlib cannot read IREE's bytecode
    assert all(r.artifact.endswith((".xla.mlirbc", ".xla.mlir")) for r in regions)
    texts = [parse_module((mixed.out_dir / r.artifact).read_bytes(), new_context()).operation.get_asm()
             for r in regions]
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke(fn, *args))
    return outs[0], outs[1], regions, texts


def _assert_close(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=TOL.rtol, atol=TOL.atol)


# --- torch models on model-zoo shapes ---------------------------------------------------------------


def _torch_case(kind: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "resnet50-conv3x3":  # layer1 3x3, 64 -> 64 at 56x56
        return nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()), (1, 64, 56, 56), "stablehlo.convolution"
    if kind == "resnet50-strided-1x1":  # layer2 downsample, 256 -> 512, stride 2
        return nn.Conv2d(256, 512, 1, stride=2, bias=False), (1, 256, 56, 56), "stablehlo.convolution"
    if kind == "mobilenetv2-depthwise":  # 144 channels, 3x3 depthwise at 56x56
        return nn.Sequential(nn.Conv2d(144, 144, 3, padding=1, groups=144), nn.ReLU6()), (1, 144, 56, 56), \
            "stablehlo.convolution"
    if kind == "bert-ffn-up":  # BERT-base FFN up projection scaled down 4x (128 tokens, 192 -> 768)
        return nn.Linear(192, 768), (1, 128, 192), "stablehlo.dot_general"
    if kind == "softmax":  # attention scores, 12 heads x 128 x 128
        return nn.Softmax(dim=-1), (1, 12, 128, 128), "stablehlo.exponential"
    if kind == "layernorm":  # BERT-base hidden, 128 tokens
        return nn.LayerNorm(768), (1, 128, 768), "stablehlo.rsqrt"
    raise KeyError(kind)


TORCH_CASES = ["resnet50-conv3x3", "resnet50-strided-1x1", "mobilenetv2-depthwise", "bert-ffn-up", "softmax",
               "layernorm"]


@pytest.mark.parametrize("kind", TORCH_CASES)
def test_model_zoo_shapes_match_iree(kind, torch, tmp_path):
    model, shape, key_op = _torch_case(kind)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    bytecode = import_torch(model.eval(), [x], new_context()).operation.get_asm(binary=True)
    got, want, _, texts = _run_both(lambda: parse_module(bytecode, new_context()), "main", [x.numpy()], tmp_path)
    assert any(key_op in t for t in texts)
    assert not any("dense_resource" in t for t in texts)
    _assert_close(got, want)


def test_dense_resource_weights_are_inlined(torch, tmp_path):
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh()).eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    module = import_torch(model, [x], new_context())
    bytecode = module.operation.get_asm(binary=True)
    assert "dense_resource<" in module.operation.get_asm()  # torch-mlir's weights
    got, want, _, texts = _run_both(lambda: parse_module(bytecode, new_context()), "main", [x.numpy()], tmp_path)
    text = "\n".join(texts)
    assert 'dense<"0x' in text and "dense_resource" not in text and "dialect_resources" not in text
    assert "collage." not in text and "func.func public @main" in text
    _assert_close(got, want)
    np.testing.assert_allclose(got[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-5)



# --- inline StableHLO: reductions, i64 --------------------------------------------------------------

REDUCTIONS = """
func.func @reduce(%x: tensor<8x512x64xf32>) -> (tensor<8x64xf32>, tensor<8x512xf32>, tensor<512x64xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x512x64xf32>, tensor<f32>) -> tensor<8x64xf32>
  %max = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [2] : (tensor<8x512x64xf32>, tensor<f32>) -> tensor<8x512xf32>
  %s0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x512x64xf32>, tensor<f32>) -> tensor<512x64xf32>
  %n = stablehlo.constant dense<8.0> : tensor<512x64xf32>
  %mean = stablehlo.divide %s0, %n : tensor<512x64xf32>
  return %sum, %max, %mean : tensor<8x64xf32>, tensor<8x512xf32>, tensor<512x64xf32>
}
"""

INT64 = """
func.func @ints(%a: tensor<16x32xi64>, %b: tensor<16x32xi64>) -> (tensor<16x32xi64>, tensor<16xi64>, tensor<16x32xi1>) {
  %big = stablehlo.constant dense<8589934592> : tensor<16x32xi64>
  %0 = stablehlo.multiply %a, %b : tensor<16x32xi64>
  %1 = stablehlo.add %0, %big : tensor<16x32xi64>
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %2 = stablehlo.reduce(%1 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<16x32xi64>, tensor<i64>) -> tensor<16xi64>
  %3 = stablehlo.compare GT, %a, %b : (tensor<16x32xi64>, tensor<16x32xi64>) -> tensor<16x32xi1>
  return %1, %2, %3 : tensor<16x32xi64>, tensor<16xi64>, tensor<16x32xi1>
}
"""


def test_reductions_match_iree(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 512, 64)).astype(np.float32)
    got, want, regions, texts = _run_both(lambda: parse_module(REDUCTIONS, new_context()), "reduce", [x], tmp_path)
    assert sum(t.count("stablehlo.reduce(") for t in texts) == 3
    _assert_close(got, want)


def test_i64_keeps_64_bits(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.integers(-(2**40), 2**40, (16, 32), dtype=np.int64)
    b = rng.integers(-1000, 1000, (16, 32), dtype=np.int64)
    got, want, _, _ = _run_both(lambda: parse_module(INT64, new_context()), "ints", [a, b], tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[0], a * b + 2**33)


#: JAX's post-processing as ``jax.jit(f).lower(x).as_text()`` writes it: softmax, then ``lax.top_k`` (a
#: ``chlo.top_k``, whose attribute IREE's bytecode writes in a form jaxlib 0.10.2 cannot read).
TOP_K = """
func.func public @main(%arg0: tensor<4x32xf32>) -> (tensor<4x3xf32> {jax.result_info = "result[0]"}, tensor<4x3xi32> {jax.result_info = "result[1]"}) {
  %e = stablehlo.exponential %arg0 : tensor<4x32xf32>
  %values, %indices = chlo.top_k(%e, k = 3) : tensor<4x32xf32> -> (tensor<4x3xf32>, tensor<4x3xi32>)
  return %values, %indices : tensor<4x3xf32>, tensor<4x3xi32>
}
"""


def test_jax_top_k_is_written_as_jaxlib_reads_it(tmp_path):
    """A region jaxlib cannot read as IREE's bytecode is written as text, checked at compile time: the
    program ran ``Failed to parse using StableHLO v1.17.0`` at load before."""
    from collage_mlir.backends.xla_cpu import jaxlib_parse_error, region_module_bytecode

    module = parse_module(TOP_K, new_context())
    assert "IntegerAttr" in jaxlib_parse_error(region_module_bytecode(next(iter(module.body.operations))))
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    got, want, regions, texts = _run_both(lambda: parse_module(TOP_K, new_context()), "main", [x], tmp_path)
    assert [r.artifact.rsplit(".", 2)[1:] for r in regions] == [["xla", "mlir"]]
    assert "chlo.top_k" in texts[0]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.fast
def test_unsupported_ops_are_refused():
    from collage_mlir.backends.xla_cpu import XlaCpuBackend

    src = """
    func.func @f(%x: tensor<4xf32>, %d: tensor<?xf32>) -> (tensor<4xf32>, tensor<?xf32>) {
      %0 = stablehlo.custom_call @foo(%x) : (tensor<4xf32>) -> tensor<4xf32>
      %1 = stablehlo.abs %d : tensor<?xf32>
      return %0, %1 : tensor<4xf32>, tensor<?xf32>
    }
    """
    module = parse_module(src, new_context())
    ops = [op.operation for op in module.body.operations[0].regions[0].blocks[0].operations]
    (pattern,) = XlaCpuBackend.patterns
    assert "custom" in pattern.rejects(ops[0])
    assert "static" in pattern.rejects(ops[1])
    assert XlaCpuBackend().supports(ops[0]) and XlaCpuBackend().supports(ops[1])


@pytest.mark.fast
def test_types_outside_its_tolerance_are_refused():
    """f16 (XLA accumulates in f32, IREE in f16: rel errors of 1e-1 on a matmul) and complex."""
    from collage_mlir.backends.xla_cpu import XlaCpuBackend

    module = parse_module("""
    func.func @f(%h: tensor<4xf16>, %c: tensor<4xcomplex<f32>>) -> (tensor<4xf16>, tensor<4xcomplex<f32>>) {
      %0 = stablehlo.tanh %h : tensor<4xf16>
      %1 = stablehlo.negate %c : tensor<4xcomplex<f32>>
      return %0, %1 : tensor<4xf16>, tensor<4xcomplex<f32>>
    }
    """, new_context())
    f16, cplx = (op.operation for op in list(module.body.operations[0].regions[0].blocks[0].operations)[:2])
    assert "f16" in XlaCpuBackend().supports(f16)
    assert "complex" in XlaCpuBackend().supports(cplx)


@pytest.mark.fast
def test_region_boundaries_keep_f64_and_constants_on_iree():
    from collage_mlir.graph import Graph
    from collage_mlir.passes.number_ops import NumberOpsPass

    src = """
    func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
      %c = stablehlo.constant dense<[2.0, 3.0, 4.0, 5.0]> : tensor<4xf64>
      %n = stablehlo.negate %c : tensor<4xf64>
      %0 = stablehlo.convert %x : (tensor<4xf32>) -> tensor<4xf64>
      %1 = stablehlo.multiply %0, %n : tensor<4xf64>
      %2 = stablehlo.convert %1 : (tensor<4xf64>) -> tensor<4xf32>
      return %2 : tensor<4xf32>
    }
    """
    module = parse_module(src, new_context())
    NumberOpsPass().run(module)
    graph = Graph(module)
    backend = get_backend("xla-cpu")
    by_name: dict[str, list[int]] = {}
    for i in sorted(graph.nodes):
        by_name.setdefault(graph.nodes[i].name.split(".")[1], []).append(i)
    (c,), (neg,), (conv_in, conv_out), (mul,) = (by_name[k] for k in ("constant", "negate", "convert", "multiply"))
    assert "constant" in backend.accepts(graph, frozenset({c, neg}))  # pure constant subgraph
    assert "f64" in backend.accepts(graph, frozenset({conv_in}))  # f64 result leaves the region
    assert "f64" in backend.accepts(graph, frozenset({conv_in, mul, conv_out}))  # negate's f64 comes in
    everything = frozenset(graph.nodes)
    assert backend.accepts(graph, everything) is None
    regions = {c.ops for c in backend.candidates(graph)}
    assert frozenset({c}) not in regions and frozenset({conv_in}) not in regions
    assert all(backend.accepts(graph, r) is None for r in regions)
