"""Quantize/dequantize in StableHLO (``!quant.uniform``, per tensor and per axis) translated to ONNX
``QuantizeLinear``/``DequantizeLinear``: a quantized weight becomes an 8-bit initializer that stays
dequantized in the graph (not folded back to f32), so ONNX Runtime fuses the pattern into ``QLinearMatMul``;
both engines' programs agree with IREE alone."""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir.dialects.stablehlo import QuantType, quant_type
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context, parse_module
from collage_mlir.iree import compile_module
from collage_mlir.search import resolve_plan

W = np.round(np.random.default_rng(1).uniform(-1, 1, (8, 6)), 2).astype(np.float32)
PER_AXIS = "!quant.uniform<i8:f32:1, {0.01:0, 0.02:0, 0.01:1, 0.01:0, 0.01:0, 0.01:-1}>"
MODULE = f"""
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x6xf32> {{
  %w = stablehlo.constant dense<{W.tolist()}> : tensor<8x6xf32>
  %qx = stablehlo.uniform_quantize %x : (tensor<4x8xf32>) -> tensor<4x8x!quant.uniform<i8:f32, 0.05:3>>
  %dx = stablehlo.uniform_dequantize %qx : (tensor<4x8x!quant.uniform<i8:f32, 0.05:3>>) -> tensor<4x8xf32>
  %qw = stablehlo.uniform_quantize %w : (tensor<8x6xf32>) -> tensor<8x6x{PER_AXIS}>
  %dw = stablehlo.uniform_dequantize %qw : (tensor<8x6x{PER_AXIS}>) -> tensor<8x6xf32>
  %y = stablehlo.dot_general %dx, %dw, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x6xf32>) -> tensor<4x6xf32>
  %qy = stablehlo.uniform_quantize %y : (tensor<4x6xf32>) -> tensor<4x6x!quant.uniform<i8:f32, 0.1:-2>>
  %dy = stablehlo.uniform_dequantize %qy : (tensor<4x6x!quant.uniform<i8:f32, 0.1:-2>>) -> tensor<4x6xf32>
  return %dy : tensor<4x6xf32>
}}
"""


@pytest.mark.fast
def test_quant_types_read_per_tensor_per_axis_and_narrow():
    assert quant_type("!quant.uniform<i8:f32, 1.000000e-01:-2>") == QuantType("i8", "f32", (0.1,), (-2,))
    assert quant_type("!quant.uniform<u8:f32:1, {5.000000e-01,2.500000e-01:7}>") == QuantType(
        "u8", "f32", (0.5, 0.25), (0, 7), axis=1)
    assert quant_type("!quant.uniform<i8<-127:127>:f32, 0.5>").storage_range == (-127, 127)
    assert quant_type("f32") is None


@pytest.mark.fast
def test_constants_quantize_half_to_even_and_saturate():
    q = QuantType("i8", "f32", (0.5,), (1,))
    assert q.quantize(np.array([0.25, 0.75, -0.25, 100.0, -100.0], np.float32)).tolist() == [
        1, 3, 1, 127, -128]
    per_axis = QuantType("u8", "f32", (1.0, 0.5), (0, 10), axis=1)
    assert per_axis.quantize(np.array([[2.0, 2.0], [-3.0, 300.0]], np.float32)).tolist() == [
        [2, 14], [0, 255]]


def _compiled(plan: str, out):
    module = parse_module(MODULE, new_context())
    number_ops(module)
    result = compile_module(module, resolve_plan(plan, Graph(module)), out)
    return result


@pytest.mark.parametrize("engine, steps", [("ort", 0), ("openvino", 1)])
def test_quantized_regions_on_the_onnx_engines(engine, steps, tmp_path):
    """The whole q/dq/matmul/q/dq graph is one region of the engine; ONNX Runtime agrees with IREE exactly
    (it computes the same int8 arithmetic), OpenVINO within ``steps`` steps of the output's scale (0.1)."""
    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[engine])
    x = np.random.default_rng(0).uniform(-3, 3, (4, 8)).astype(np.float32)
    _compiled("default", tmp_path / "iree")
    result = _compiled(f"whole:{engine}", tmp_path / engine)
    (region,) = result.plan.regions
    assert len(region.ops) == 8  # every op but the return: quantized values never cross the boundary
    with collage_runtime.load(tmp_path / "iree") as p:
        (want,) = p.invoke("main", x)
    with collage_runtime.load(tmp_path / engine) as p:
        (got,) = p.invoke("main", x)
    assert np.abs(got - want).max() <= steps * 0.1 + 1e-6


def test_onnx_runtime_fuses_the_quantized_matmul(tmp_path):
    """The weight is an 8-bit initializer behind a DequantizeLinear in the translated graph, and ONNX
    Runtime's own optimizer turns the pattern into one QLinearMatMul (its int8 kernel)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    result = _compiled("whole:ort", tmp_path / "ort")
    (entry,) = result.manifest.regions
    model = onnx.load(tmp_path / "ort" / entry.artifact)
    kinds = [n.op_type for n in model.graph.node]
    assert kinds.count("DequantizeLinear") == 3 and "MatMul" in kinds
    assert {i.name: i.data_type for i in model.graph.initializer}.get(
        next(n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith(
            "quantized"))) == onnx.TensorProto.INT8
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(tmp_path / "ort" / entry.artifact), options, providers=["CPUExecutionProvider"])
    assert "QLinearMatMul" in [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]


BATCHED = f"""
func.func @main(%x: tensor<1x4x8xf32>) -> tensor<1x4x6xf32> {{
  %w = stablehlo.constant dense<{W.tolist()}> : tensor<8x6xf32>
  %qx = stablehlo.uniform_quantize %x : (tensor<1x4x8xf32>) -> tensor<1x4x8x!quant.uniform<i8:f32, 0.05:3>>
  %dx = stablehlo.uniform_dequantize %qx : (tensor<1x4x8x!quant.uniform<i8:f32, 0.05:3>>) -> tensor<1x4x8xf32>
  %qw = stablehlo.uniform_quantize %w : (tensor<8x6xf32>) -> tensor<8x6x{PER_AXIS}>
  %dw = stablehlo.uniform_dequantize %qw : (tensor<8x6x{PER_AXIS}>) -> tensor<8x6xf32>
  %rw = stablehlo.reshape %dw : (tensor<8x6xf32>) -> tensor<1x8x6xf32>
  %y = stablehlo.dot_general %dx, %rw, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x4x8xf32>, tensor<1x8x6xf32>) -> tensor<1x4x6xf32>
  %qy = stablehlo.uniform_quantize %y : (tensor<1x4x6xf32>) -> tensor<1x4x6x!quant.uniform<i8:f32, 0.1:-2>>
  %dy = stablehlo.uniform_dequantize %qy : (tensor<1x4x6x!quant.uniform<i8:f32, 0.1:-2>>) -> tensor<1x4x6xf32>
  return %dy : tensor<1x4x6xf32>
}}
"""


def test_a_batched_quantized_matmul_is_fused_too(tmp_path):
    """torch-mlir's batched dot_general reshapes the dequantized weight to [1, K, N]: the translation hands
    the MatMul the dequantized weight itself (ONNX's MatMul broadcasts), so ONNX Runtime still fuses it."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    module = parse_module(BATCHED, new_context())
    number_ops(module)
    result = compile_module(module, resolve_plan("whole:ort", Graph(module)), tmp_path / "ort")
    (entry,) = result.manifest.regions
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(tmp_path / "ort" / entry.artifact), options, providers=["CPUExecutionProvider"])
    assert "QLinearMatMul" in [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]


def test_an_erf_between_quantize_pairs_is_one_erf_again(tmp_path):
    """torch-mlir spells ONNX's Erf as a ~30-op polynomial; in a quantized GELU a QuantizeLinear follows
    the erf, so no GELU is there to recognise: the polynomial alone becomes one Erf again (ORT's own op)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from collage_mlir.frontends import load_model

    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("s", 0.05), ("r", 1.4142135))]
    consts.append(numpy_helper.from_array(np.array(0, np.int8), "z"))
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
         helper.make_node("Div", ["d", "r"], ["h"]), helper.make_node("Erf", ["h"], ["e"]),
         helper.make_node("QuantizeLinear", ["e", "s", "z"], ["qe"]), helper.make_node("DequantizeLinear", ["qe", "s", "z"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    module = load_model(tmp_path / "m.onnx", new_context())
    number_ops(module)
    result = compile_module(module, resolve_plan("whole:ort", Graph(module)), tmp_path / "ort")
    (entry,) = result.manifest.regions
    kinds = [n.op_type for n in onnx.load(tmp_path / "ort" / entry.artifact).graph.node]
    assert kinds.count("Erf") == 1 and "Mul" not in kinds, kinds
    x = np.random.default_rng(0).uniform(-3, 3, (4, 16)).astype(np.float32)
    ort = pytest.importorskip("onnxruntime")
    (want,) = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with collage_runtime.load(tmp_path / "ort") as p:
        (got,) = p.invoke("main", x)
    np.testing.assert_array_equal(got, want)
