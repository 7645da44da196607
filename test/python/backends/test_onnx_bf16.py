"""bf16 regions on the ONNX engines: the translator computes a bf16 value as f32 between the graph's Casts
(the region's inputs and outputs stay bf16, a conversion to bf16 rounds), reads bf16 constants from their
printed form, and the executors bind ml_dtypes' bfloat16 arrays zero-copy. A JAX user's bf16 CNN then runs
whole on ONNX Runtime and OpenVINO, within bf16's tolerance of `jax.jit` (5e-2 of scale, as the import
check allows bf16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import collage_runtime
from collage_mlir.backends import get_backend
from collage_mlir.dialects import stablehlo as sh
from collage_mlir.ir import ir, new_context, parse_module
from collage_mlir.onnx import translate

BF16 = ml_dtypes.bfloat16

MODULE = """
func.func @main(%a: tensor<2x3xbf16>, %b: tensor<2x3xf32>) -> (tensor<2x3xbf16>, tensor<2x3xf32>, tensor<2x3xf32>) {
  %c = stablehlo.convert %b : (tensor<2x3xf32>) -> tensor<2x3xbf16>
  %s = stablehlo.add %a, %c : tensor<2x3xbf16>
  %w = stablehlo.constant dense<"0xC03F0040D0C0803F0000803F"> : tensor<2x3xbf16>
  %m = stablehlo.multiply %s, %w : tensor<2x3xbf16>
  %f = stablehlo.convert %c : (tensor<2x3xbf16>) -> tensor<2x3xf32>
  %g = stablehlo.convert %s : (tensor<2x3xbf16>) -> tensor<2x3xf32>
  return %m, %f, %g : tensor<2x3xbf16>, tensor<2x3xf32>, tensor<2x3xf32>
}
"""


@pytest.mark.parametrize("text, want", [
    ('dense<"0x803FC0BF"> : tensor<2xbf16>', [1.0, -1.5]),
    ("dense<[[1.5, 2.0], [-3.25, 1.0e+30]]> : tensor<2x2xbf16>", [1.5, 2.0, -3.25, float(BF16(1e30))]),
    ("dense<[0x7F80, 0xFF80]> : tensor<2xbf16>", [np.inf, -np.inf]),
])
def test_bf16_constants_are_read_from_their_printed_form(text, want):
    """The bindings' buffer cannot carry bf16: a constant is read from its hex blob or its list."""
    with new_context(), ir.Location.unknown():
        attr = ir.Attribute.parse(text)
        shape = tuple(ir.ShapedType(attr.type).shape)
        got = sh.dense_values(attr, shape, "bf16")
    assert got.dtype == BF16 and got.shape == shape
    np.testing.assert_array_equal(got.astype(np.float32).ravel(), np.asarray(want, np.float32))


def test_a_bf16_region_is_f32_math_between_casts():
    """Inputs and outputs keep bf16 (ONNX's BFLOAT16), one Cast each; the math in between is f32; a
    conversion to bf16 rounds as bf16 does (the f32 result of converting it back is numpy's rounding, exactly),
    and so does a conversion from bf16 (a sum the graph holds in f32 leaves as the model's bf16 sum)."""
    import onnx
    import onnxruntime as ort

    with new_context() as ctx:
        module = parse_module(MODULE, ctx)
        model = translate(next(iter(module.body.operations)))
    bf16 = onnx.TensorProto.BFLOAT16
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [bf16, onnx.TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [bf16] + [onnx.TensorProto.FLOAT] * 2
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    computed = {v.name: v.type.tensor_type.elem_type for v in inferred}
    math = [n for n in model.graph.node if n.op_type in ("Add", "Mul")]
    assert math and all(computed.get(n.output[0]) == onnx.TensorProto.FLOAT for n in math)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3)).astype(BF16)
    b = (rng.standard_normal((2, 3)) * 3).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    m, f, g = np.zeros((2, 3), BF16), np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    bits = ort.OrtValue.ortvalue_from_numpy_with_onnx_type  # numpy has no bf16: ORT takes the bits
    binding.bind_ortvalue_input("in0", bits(a.view(np.uint16), bf16))
    binding.bind_cpu_input("in1", b)
    binding.bind_ortvalue_output("out0", bits(m.view(np.uint16), bf16))
    binding.bind_ortvalue_output("out1", ort.OrtValue.ortvalue_from_numpy(f))
    binding.bind_ortvalue_output("out2", ort.OrtValue.ortvalue_from_numpy(g))
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(f, b.astype(BF16).astype(np.float32))
    total = a.astype(np.float32) + b.astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(g, total.astype(BF16).astype(np.float32))
    w = np.array([[1.5, 2.0, -6.5], [1.0, 0.0, 1.0]], np.float32)
    want = total * w
    np.testing.assert_allclose(m.astype(np.float32), want, rtol=2 ** -8, atol=0)


def _user_cnn():
    """A JAX user's bf16 CNN: params in a dict cast with `jax.tree.map`, NHWC, `jax.nn`, a max pool, a
    residual, a mean and log-softmax."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

    def conv_p(cin, cout):
        return {"w": rng.standard_normal((3, 3, cin, cout)) * np.sqrt(2 / (9 * cin)), "b": rng.standard_normal(cout) * 0.1}

    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.bfloat16), {
        "c1": conv_p(3, 16), "c2": conv_p(16, 32), "c3": conv_p(32, 32),
        "fc": {"w": rng.standard_normal((32, 10)) * 0.3, "b": np.zeros(10)}})

    def conv(x, p, stride=1):
        y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y + p["b"])

    def forward(x):
        x = conv(x, params["c1"])
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        x = conv(x, params["c2"], 2)
        x = x + conv(x, params["c3"])
        return jax.nn.log_softmax(jnp.mean(x, axis=(1, 2)) @ params["fc"]["w"] + params["fc"]["b"])

    x = rng.standard_normal((2, 32, 32, 3)).astype(BF16)
    return jax, forward, x


@pytest.mark.parametrize("backend", ["ort", "openvino", "openvino-bf16"])
def test_a_bf16_jax_cnn_runs_whole_on_an_onnx_engine(backend, tmp_path):
    jax, forward, x = _user_cnn()
    if (problem := get_backend(backend).available()) is not None:
        pytest.skip(f"{backend}: {problem}")
    from collage_mlir.iree import compile_file

    (tmp_path / "m.mlir").write_text(jax.export.export(jax.jit(forward))(x).mlir_module())
    manifest = compile_file(str(tmp_path / "m.mlir"), plan=f"whole:{backend}", output_dir=str(tmp_path / "a"))
    assert [r.backend for r in manifest.regions] == [backend]
    want = np.asarray(jax.jit(forward)(x)).astype(np.float32)
    with collage_runtime.load(tmp_path / "a") as program:
        for _ in range(2):  # the second call reuses the bound tensors
            (got,) = program.invoke("main", x)
            got = np.asarray(got)
            assert got.dtype == BF16
            assert np.abs(got.astype(np.float32) - want).max() <= 5e-2 * np.abs(want).max()


def test_a_kept_onnx_node_reads_and_writes_its_own_bf16():
    """An ONNX node kept as ONNX with bf16 operands (its constant bf16 too) gets bf16 (a Cast from the graph's
    f32 where it enters) and its result is cast back: the model type-checks strictly (Mul of f32 and bf16
    did not)."""
    import base64

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.array([2.0, 3.0, 4.0], np.float32), "c")
    c.data_type, c.raw_data = TensorProto.BFLOAT16, np.array([2.0, 3.0, 4.0], np.float32).astype(BF16).tobytes()
    node = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["in0", "c"], ["out0"])], "kept",
        [helper.make_tensor_value_info("in0", TensorProto.BFLOAT16, [3])],
        [helper.make_tensor_value_info("out0", TensorProto.BFLOAT16, [3])], initializer=[c]),
        opset_imports=[helper.make_opsetid("", 18)])
    config = base64.b64encode(node.SerializeToString()).decode()
    text = f"""
    func.func @main(%a: tensor<3xbf16>) -> tensor<3xbf16> {{
      %0 = stablehlo.negate %a : tensor<3xbf16>
      %1 = stablehlo.custom_call @collage.onnx_node(%0) {{backend_config = "{config}", has_side_effect = false}} : (tensor<3xbf16>) -> tensor<3xbf16>
      %2 = stablehlo.abs %1 : tensor<3xbf16>
      return %2 : tensor<3xbf16>
    }}"""
    with new_context() as ctx:
        module = parse_module(text, ctx)  # held: its ops die with it
        model = translate(next(iter(module.body.operations)))
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    mul = next(n for n in model.graph.node if n.op_type == "Mul")
    casts = {n.output[0]: n for n in model.graph.node if n.op_type == "Cast"}
    assert casts[mul.input[0]].attribute[0].i == TensorProto.BFLOAT16
    assert any(n.input[0] == mul.output[0] and n.attribute[0].i == TensorProto.FLOAT for n in casts.values())
