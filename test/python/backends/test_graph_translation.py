"""Graph backends take whole models: the ONNX translation is simplified to what torch.onnx.export
writes (batch norm folded into the convolution, constants folded), and a ResNet-style CNN and a
BERT-style encoder (embedding gathers, an iota, an i1 ``and`` reduction in attention) each go to
ort, openvino and xla-cpu as one region, matching IREE alone within the backend's tolerance."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import collage_runtime
from collage_mlir.backends import get_backend
from collage_mlir.onnx import translate
from collage_mlir.errors import CollageError
from collage_mlir.frontends.torch import import_torch
from collage_mlir.graph import Graph
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.plan import Plan, Region
from collage_mlir.zoo.tiny import encoder, resnet

GRAPH_BACKENDS = {"ort": "onnxruntime", "openvino": "openvino", "xla-cpu": "jaxlib"}


MODELS = {"resnet": resnet, "encoder": encoder}


def _main(module):
    return next(f for f in module.body.operations if str(f.attributes["sym_name"]).strip('"') == "main")


def whole_model_plan(module, backend: str) -> Plan:
    """One region holding every op of the module, on ``backend``."""
    NumberOpsPass().run(module)
    return Plan([Region("whole", backend, frozenset(Graph(module).nodes))], source=f"whole:{backend}")


def test_resnet_onnx_is_as_small_as_torch_export(torch):
    """Batch norm folds into the convolutions, relu is Relu, the head is one Gemm: the node count is
    torch.onnx.export's (give or take a reshape), and the simplified graph computes the same."""
    ort = pytest.importorskip("onnxruntime")
    model, x = resnet()
    module = import_torch(model, [x], new_context())
    raw, simple = translate(_main(module), simplify=False), translate(_main(module))
    ops = collections.Counter(n.op_type for n in simple.graph.node)
    assert len(raw.graph.node) > 100  # op by op: 5x as many nodes before simplification
    assert ops["Conv"] == 5 and ops["Relu"] == 4 and ops["Gemm"] == 1 and ops["ReduceMean"] == 1, ops
    assert not {"Sub", "Mul", "Div", "Expand", "Sqrt", "Max", "Identity"} & set(ops), ops  # no batch norm left
    assert len(simple.graph.node) <= 14, ops  # torch.onnx.export writes 14 nodes for this model
    with torch.no_grad():
        want = model(x).numpy()
    for m in (raw, simple):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"in0": x.numpy()})[0], want, rtol=1e-4, atol=1e-5)


def test_encoder_onnx_has_the_fused_forms(torch):
    """Softmax, GELU and LayerNormalization come out as the forms ORT and OpenVINO fuse (GELU and layer
    norm found by evaluation: torch-mlir writes a 30-op erf approximation and an f64 variance); the
    simplified graph computes the same."""
    ort = pytest.importorskip("onnxruntime")
    model, ids = encoder()
    module = import_torch(model, [ids], new_context())
    raw, simple = translate(_main(module), simplify=False), translate(_main(module))
    ops = collections.Counter(n.op_type for n in simple.graph.node)
    assert ops["Softmax"] == 1 and ops["Erf"] == 1 and ops["LayerNormalization"] == 3 and ops["Gather"] >= 1, ops
    assert not {"ReduceMean", "ReduceSum", "Sqrt", "Reciprocal"} & set(ops), ops
    assert len(simple.graph.node) < len(raw.graph.node) / 2, (len(simple.graph.node), len(raw.graph.node))
    with torch.no_grad():
        want = model(ids).numpy()
    session = ort.InferenceSession(simple.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"in0": ids.numpy()})[0], want, rtol=1e-4, atol=1e-5)


def test_jax_encoder_onnx_has_the_fused_forms(tmp_path):
    """A JAX encoder written with jax.nn (standardize, softmax, tanh-approximate gelu; a residual reads each
    normalized input too): LayerNormalization, Softmax (jax floors the max at -inf) and the tanh GELU in the
    form ONNX Runtime fuses into FastGelu, at a static shape and with the sequence dynamic; the simplified
    graphs compute what jax does (rtol 1e-4, atol 1e-5)."""
    jax = pytest.importorskip("jax")
    ort = pytest.importorskip("onnxruntime")
    import jax.numpy as jnp

    from collage_mlir.frontends import stablehlo

    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in
         {"qkv": (32, 96), "out": (32, 32), "up": (32, 64), "down": (64, 32)}.items()}

    def encoder(x):
        q, k, v = jnp.split(jax.nn.standardize(x, axis=-1, epsilon=1e-5) @ w["qkv"], 3, axis=-1)
        x = x + jax.nn.softmax(q @ k.T / 32 ** 0.5, axis=-1) @ v @ w["out"]
        return x + jax.nn.gelu(jax.nn.standardize(x, axis=-1, epsilon=1e-5) @ w["up"]) @ w["down"]

    x = rng.standard_normal((16, 32)).astype(np.float32)
    path = tmp_path / "enc.mlir"
    path.write_text(jax.jit(encoder).lower(x).as_text())
    module = stablehlo.load(path, new_context())
    model = translate(_main(module))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["LayerNormalization"] == 2 and ops["Softmax"] == 1 and ops["Tanh"] == ops["Pow"] == 1, ops
    assert not {"ReduceMean", "ReduceSum", "ReduceMax", "Sqrt", "Exp"} & set(ops), ops
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    import onnx

    assert "FastGelu" in {n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node}
    np.testing.assert_allclose(session.run(None, {"in0": x})[0], np.asarray(jax.jit(encoder)(x)), rtol=1e-4, atol=1e-5)

    # The same with the sequence dynamic (jax.export's symbol; the fallback between shape buckets): its
    # broadcasts left to ONNX's, the same fused forms, no Expand.
    from collage_mlir.shaped import dynamic_onnx

    (s,) = jax.export.symbolic_shape("s")
    path.write_text(jax.export.export(jax.jit(encoder))(jax.ShapeDtypeStruct((s, 32), np.float32)).mlir_module())
    module = stablehlo.load(path, new_context())
    dynamic = dynamic_onnx(module, str(path))
    ops = collections.Counter(n.op_type for n in dynamic.graph.node)
    assert ops["LayerNormalization"] == 2 and ops["Softmax"] == 1 and ops["Tanh"] == ops["Pow"] == 1, ops
    assert not {"ReduceSum", "ReduceMax", "Exp", "Expand"} & set(ops), ops
    session = ort.InferenceSession(dynamic.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (5, 16, 23):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"in0": x})[0], np.asarray(jax.jit(encoder)(x)), rtol=1e-4,
                                   atol=1e-5)


def test_jax_nhwc_cnn_translates_with_a_dynamic_batch(tmp_path):
    """A JAX NHWC CNN (jax.nn, ``lax.conv_general_dilated``, max and average pooling over ``reduce_window``)
    exported with a symbolic batch translates with the batch kept (the fallback between shape buckets on
    ONNX Runtime or OpenVINO) and computes what jax does at any batch (rtol 1e-4, atol 1e-5); a pooling
    window over the dynamic dim is refused by name."""
    jax = pytest.importorskip("jax")
    ort = pytest.importorskip("onnxruntime")
    import jax.numpy as jnp

    from collage_mlir.frontends import stablehlo
    from collage_mlir.shaped import dynamic_onnx

    rng = np.random.default_rng(0)
    k1, k2 = (rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((3, 3, 3, 8), (3, 3, 8, 16)))
    nhwc = ("NHWC", "HWIO", "NHWC")

    def cnn(x):
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=nhwc))
        y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        y = jax.nn.gelu(jax.lax.conv_general_dilated(y, k2, (2, 2), "SAME", dimension_numbers=nhwc))
        y = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4
        return jax.nn.log_softmax(y.mean(axis=(1, 2)))

    (b,) = jax.export.symbolic_shape("b")
    path = tmp_path / "cnn.mlir"
    path.write_text(jax.export.export(jax.jit(cnn))(jax.ShapeDtypeStruct((b, 16, 16, 3), np.float32)).mlir_module())
    model = dynamic_onnx(stablehlo.load(path, new_context()), str(path))
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "MaxPool", "AveragePool"} <= ops, ops
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3, 6):
        x = rng.standard_normal((n, 16, 16, 3)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"in0": x})[0], np.asarray(jax.jit(cnn)(x)), rtol=1e-4, atol=1e-5)

    def batch_pool(x):  # a window across the batch: its rows are not independent
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 1, 1, 1), (1, 1, 1, 1), "VALID")

    path.write_text(jax.export.export(jax.jit(batch_pool))(jax.ShapeDtypeStruct((b, 4, 4, 3), np.float32)).mlir_module())
    with pytest.raises(CollageError, match="a dynamic dim only among the window's two independent dims"):
        dynamic_onnx(stablehlo.load(path, new_context()), str(path))


def test_jax_dot_product_attention_translates_with_a_dynamic_sequence(tmp_path):
    """``jax.nn.dot_product_attention`` (causal; four query heads over two key heads, and one each) exported
    with a symbolic sequence translates with it kept: its dot_generals carry a size-1 free dim beside a
    dynamic one (the query group), squeezed around ONNX's ``MatMul``; at every length the session computes
    what jax does (rtol 1e-4, atol 1e-5)."""
    jax = pytest.importorskip("jax")
    ort = pytest.importorskip("onnxruntime")

    from collage_mlir.frontends import stablehlo
    from collage_mlir.shaped import dynamic_onnx

    rng = np.random.default_rng(0)
    wq, wkv = rng.standard_normal((32, 32)).astype(np.float32) * 0.2, rng.standard_normal((32, 16)).astype(np.float32) * 0.2

    def attention(x, heads):  # x: [batch, seq, 32]; query heads of 8 over key/value heads of 8
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, 4, 8)
        kv = (x @ wkv).reshape(b, s, 2, 8) if heads == 2 else (x @ wq).reshape(b, s, 4, 8)
        return jax.nn.dot_product_attention(q, kv, kv, is_causal=True).reshape(b, s, 32)

    (s,) = jax.export.symbolic_shape("s")
    for heads in (2, 4):
        fn = jax.jit(lambda x: attention(x, heads))
        path = tmp_path / f"attention{heads}.mlir"
        path.write_text(jax.export.export(fn)(jax.ShapeDtypeStruct((2, s, 32), np.float32)).mlir_module())
        model = dynamic_onnx(stablehlo.load(path, new_context()), str(path))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for n in (1, 7, 20):
            x = rng.standard_normal((2, n, 32)).astype(np.float32)
            np.testing.assert_allclose(session.run(None, {"in0": x})[0], np.asarray(fn(x)), rtol=1e-4, atol=1e-5)


def test_jax_embedding_lookups_translate_with_dynamic_ids(tmp_path):
    """Token ids of a symbolic batch and length: ``table[ids]`` translates with the dims kept (``Gather`` on the
    ids with their index vector of one squeezed), clamped into range as StableHLO clamps them; ``table[:n]``
    (a ``dynamic_gather``) as a ``Slice``; a gather along a dynamic dim is one line. At every shape the
    session computes what jax does."""
    jax = pytest.importorskip("jax")
    ort = pytest.importorskip("onnxruntime")
    import jax.numpy as jnp

    from collage_mlir.frontends import stablehlo
    from collage_mlir.shaped import dynamic_onnx

    table = jnp.asarray(np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32))

    def embed(ids, scores):
        return table[ids].sum(-1) * scores

    b, s = jax.export.symbolic_shape("b, s")
    exported = jax.export.export(jax.jit(embed))(jax.ShapeDtypeStruct((b, s), np.int32),
                                                 jax.ShapeDtypeStruct((b, s), np.float32))
    path = tmp_path / "embed.mlir"
    path.write_text(exported.mlir_module())
    session = ort.InferenceSession(dynamic_onnx(stablehlo.load(path, new_context()), str(path)).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for shape in ((1, 5), (3, 12)):
        ids = rng.integers(-3, 60, shape).astype(np.int32)  # out of range: clamped
        scores = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"in0": ids, "in1": scores})[0], np.asarray(embed(ids, scores)),
                                   rtol=1e-5, atol=1e-6)

    # table[:n] (positions cut to the length): a dynamic_gather, a Slice, its start clamped.
    (n,) = jax.export.symbolic_shape("n", constraints=["n <= 50"])
    cut = jax.export.export(jax.jit(lambda x: x + table[:x.shape[0]]))(jax.ShapeDtypeStruct((n, 8), np.float32))
    path.write_text(cut.mlir_module())
    session = ort.InferenceSession(dynamic_onnx(stablehlo.load(path, new_context()), str(path)).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for length in (1, 50, 17):
        x = rng.standard_normal((length, 8)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"in0": x})[0], x + np.asarray(table)[:length], rtol=1e-6)

    rows = jax.export.export(jax.jit(lambda t, i: t[i]))(jax.ShapeDtypeStruct((s, 4), np.float32),
                                                         jax.ShapeDtypeStruct((3,), np.int32))
    path.write_text(rows.mlir_module())
    with pytest.raises(CollageError, match="cannot export to ONNX: a gather along a dynamic dim"):
        dynamic_onnx(stablehlo.load(path, new_context()), str(path))


def test_a_weight_stays_two_dimensional_in_a_matmul_with_dynamic_dims(tmp_path):
    """``x @ w`` with ``x`` of a symbolic batch and length: the weight is ``MatMul``'s 2-D input (its missing
    leading dims broadcast by MatMul itself, not unsqueezed), so ONNX Runtime's int8 ``MatMul`` takes it
    quantized per channel (a 3-D weight: "weight zero point must be a scalar ..." at every shape)."""
    jax = pytest.importorskip("jax")
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime import quantization

    from collage_mlir.frontends import stablehlo
    from collage_mlir.shaped import dynamic_onnx

    w = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    b, s = jax.export.symbolic_shape("b, s")
    exported = jax.export.export(jax.jit(lambda x: x @ w))(jax.ShapeDtypeStruct((b, s, 8), np.float32))
    path = tmp_path / "linear.mlir"
    path.write_text(exported.mlir_module())
    model = dynamic_onnx(stablehlo.load(path, new_context()), str(path))
    weights = {t.name: t for t in model.graph.initializer}
    (matmul,) = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert list(weights[matmul.input[1]].dims) == [8, 6]
    rng = np.random.default_rng(1)

    class Batches(quantization.CalibrationDataReader):
        def __init__(self):
            self.left = [{"in0": rng.standard_normal((2, 5, 8)).astype(np.float32)} for _ in range(4)]

        def get_next(self):
            return self.left.pop() if self.left else None

    (tmp_path / "f32.onnx").write_bytes(model.SerializeToString())
    quantization.quantize_static(str(tmp_path / "f32.onnx"), str(tmp_path / "int8.onnx"), Batches(), per_channel=True,
                                 quant_format=quantization.QuantFormat.QDQ)
    session = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, 7, 8)).astype(np.float32)
    got = session.run(None, {"in0": x})[0]
    assert got.shape == (3, 7, 6) and np.abs(got - x @ w).max() <= 0.1 * np.abs(x @ w).max()


@pytest.fixture(scope="module")
def references(torch, tmp_path_factory):
    """Per model: (input, IREE-alone output)."""
    refs = {}
    for name, build in MODELS.items():
        model, x = build()
        art = compile_module(import_torch(model, [x], new_context()), "default", tmp_path_factory.mktemp(name))
        with collage_runtime.load(art.out_dir) as prog:
            (y,) = prog.invoke("main", x.numpy())
            refs[name] = (x.numpy(), np.array(y))
        with torch.no_grad():
            np.testing.assert_allclose(refs[name][1], model(x).numpy(), rtol=1e-4, atol=1e-4)  # sanity
    return refs


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("backend", sorted(GRAPH_BACKENDS))
def test_whole_model_in_one_region(model, backend, references, tmp_path):
    pytest.importorskip(GRAPH_BACKENDS[backend])
    net, x = MODELS[model]()
    module = import_torch(net, [x], new_context())
    art = compile_module(module, whole_model_plan(module, backend), tmp_path)
    assert [r.backend for r in art.manifest.regions] == [backend]
    x, want = references[model]
    with collage_runtime.load(art.out_dir) as prog:
        (got,) = prog.invoke("main", x)
        got = np.array(got)
    tol = get_backend(backend).tolerance
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol.rtol, atol=tol.atol)


# --- Element-type coverage, probed: every op on every element type a backend accepts runs on its engine
# and matches ONNX's reference evaluator (numpy) within the backend's tolerance (exactly for integers).

PROBE_TYPES = ("f32", "f64", "i32", "i64", "i1")
ONNX_ENGINES = {"ort": "onnxruntime", "openvino": "openvino"}


def _probe_functions() -> dict[str, str]:
    """name → a one-op StableHLO function, for each op the ONNX export translates, on each type."""
    out = {}
    for t in PROBE_TYPES:
        T, S = f"tensor<4x6x{t}>", f"tensor<{t}>"

        def fn(name, args, result, body):
            sig = ", ".join(f"%{chr(97 + k)}: {a}" for k, a in enumerate(args))
            out[f"{name}_{t}"] = f"func.func @{name}_{t}({sig}) -> {result} {{\n  {body}\n  return %0 : {result}\n}}"

        for op in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "and", "or", "xor"):
            fn(op, [T, T], T, f"%0 = stablehlo.{op} %a, %b : {T}")
        for op in ("negate", "abs", "exponential", "log", "sqrt", "rsqrt", "tanh", "logistic", "floor", "ceil",
                   "sine", "cosine", "not"):
            fn(op, [T], T, f"%0 = stablehlo.{op} %a : {T}")
        for d in ("EQ", "NE", "LT", "GE"):
            fn(f"compare{d}", [T, T], "tensor<4x6xi1>", f"%0 = stablehlo.compare {d}, %a, %b : ({T}, {T}) -> tensor<4x6xi1>")
        fn("select", ["tensor<4x6xi1>", T, T], T, f"%0 = stablehlo.select %a, %b, %c : tensor<4x6xi1>, {T}")
        for u in PROBE_TYPES:
            if u != t:
                fn(f"convert_to_{u}", [T], f"tensor<4x6x{u}>", f"%0 = stablehlo.convert %a : ({T}) -> tensor<4x6x{u}>")
        fn("clamp", [T, T, T], T, f"%0 = stablehlo.clamp %a, %b, %c : {T}")
        fn("transpose", [T], f"tensor<6x4x{t}>", f"%0 = stablehlo.transpose %a, dims = [1, 0] : ({T}) -> tensor<6x4x{t}>")
        fn("broadcast", [T], f"tensor<4x3x6x{t}>",
           f"%0 = stablehlo.broadcast_in_dim %a, dims = [0, 2] : ({T}) -> tensor<4x3x6x{t}>")
        fn("reshape", [T], f"tensor<24x{t}>", f"%0 = stablehlo.reshape %a : ({T}) -> tensor<24x{t}>")
        fn("concatenate", [T, T], f"tensor<4x12x{t}>",
           f"%0 = stablehlo.concatenate %a, %b, dim = 1 : ({T}, {T}) -> tensor<4x12x{t}>")
        fn("slice", [T], f"tensor<3x3x{t}>", f"%0 = stablehlo.slice %a [1:4, 0:6:2] : ({T}) -> tensor<3x3x{t}>")
        pad = f"stablehlo.pad %a, %b, low = [1, 0], high = [0, 2], interior = [0, 0] : ({T}, {S}) -> tensor<5x8x{t}>"
        fn("pad", [T, S], f"tensor<5x8x{t}>", f"%0 = {pad}")
        fn("pad_const", [T], f"tensor<5x8x{t}>", f"%b = stablehlo.constant dense<{'true' if t == 'i1' else 1}> : {S}\n  %0 = {pad}")
        for kind in ("add", "multiply", "maximum", "minimum", "and", "or"):
            fn(f"reduce_{kind}", [T, S], f"tensor<4x{t}>",
               f"%0 = stablehlo.reduce(%a init: %b) applies stablehlo.{kind} across dimensions = [1] : ({T}, {S}) -> tensor<4x{t}>")
        fn("iota", [T], T, f"%i = stablehlo.iota dim = 1 : {T}\n  %0 = stablehlo.add %i, %a : {T}")
        fn("dot_general", [T, f"tensor<6x5x{t}>"], f"tensor<4x5x{t}>",
           f"%0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({T}, tensor<6x5x{t}>) -> tensor<4x5x{t}>")
        fn("convolution", [f"tensor<1x2x5x5x{t}>", f"tensor<3x2x3x3x{t}>"], f"tensor<1x3x5x5x{t}>",
           "%0 = stablehlo.convolution(%a, %b) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = "
           "{stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, "
           f"feature_group_count = 1 : i64}} : (tensor<1x2x5x5x{t}>, tensor<3x2x3x3x{t}>) -> tensor<1x3x5x5x{t}>")
        fn("max_pool", [f"tensor<1x2x7x7x{t}>", S], f"tensor<1x2x3x3x{t}>",
           f'%0 = "stablehlo.reduce_window"(%a, %b) ({{\n  ^bb0(%x: {S}, %y: {S}):\n    %r = stablehlo.maximum %x, %y : {S}\n'
           f"    stablehlo.return %r : {S}\n  }}) {{window_dimensions = array<i64: 1, 1, 3, 3>, "
           f"window_strides = array<i64: 1, 1, 2, 2>}} : (tensor<1x2x7x7x{t}>, {S}) -> tensor<1x2x3x3x{t}>")
        fn("gather", [T, "tensor<5xi32>"], f"tensor<5x6x{t}>",
           '%0 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], '
           "collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 6>}> "
           f": ({T}, tensor<5xi32>) -> tensor<5x6x{t}>")
    return out


def _probe_input(tt, k: int, rng) -> np.ndarray:
    """Unit-range floats (positive, for log/sqrt), small positive integers (no zero divisors) and, in
    a first i64 operand, one value past 2**32 (a 32-bit engine loses its high bits; one, so that
    products do not overflow)."""
    shape, et = tuple(tt[0]), tt[1]
    if et == "i1":
        return np.asarray(rng.random(shape) < 0.5)
    if et in ("i32", "i64"):
        v = np.array(rng.integers(1, 9, shape), dtype=np.int32 if et == "i32" else np.int64)
        if et == "i64" and k == 0:
            v.flat[0] += 2**33
        return v
    return np.asarray(rng.random(shape) * 2 + 0.25, dtype=np.float32 if et == "f32" else np.float64)


def _run_engine(engine: str, model_bytes: bytes, feeds: dict) -> list:
    if engine == "ort":
        import onnxruntime

        return onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, feeds)
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(model_bytes, b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds)
    return [np.asarray(results[o]) for o in compiled.outputs]


@pytest.mark.parametrize("engine", sorted(ONNX_ENGINES))
def test_engine_type_coverage(engine):
    """All probes the backend accepts go into one ONNX model (one session, one compile); a failure
    reruns them one by one to name the op and type."""
    pytest.importorskip(ONNX_ENGINES[engine])
    from onnx import compose, helper
    from onnx.reference import ReferenceEvaluator

    from collage_mlir.dialects.stablehlo import tensor_type
    from collage_mlir.ir import parse_module

    backend = get_backend(engine)
    context, rng = new_context(), np.random.default_rng(0)
    graphs, feeds, accepted, modules = [], {}, [], []
    for name, text in _probe_functions().items():
        try:
            modules.append(parse_module(text, context))
        except CollageError:  # StableHLO does not define this op on this type
            continue
        func = modules[-1].body.operations[0]
        if any(backend.supports(o.operation) for o in list(func.regions[0].blocks[0].operations)[:-1]):
            continue
        model = compose.add_prefix(translate(func), f"{name}.")
        graphs.append(model.graph)
        feeds.update({i.name: _probe_input(tensor_type(a), k, rng)
                      for k, (i, a) in enumerate(zip(model.graph.input, func.regions[0].blocks[0].arguments))})
        accepted.append(name)
    assert len(accepted) > 80  # the export's ops on f32/f64/i32/i64/i1, less what the engine lacks
    merged = helper.make_model(helper.make_graph(
        [n for g in graphs for n in g.node], "probes", [i for g in graphs for i in g.input],
        [o for g in graphs for o in g.output], [t for g in graphs for t in g.initializer]),
        opset_imports=graphs and [helper.make_opsetid("", 18)])
    merged.ir_version = 10
    want = ReferenceEvaluator(merged).run(None, feeds)
    try:
        got = _run_engine(engine, merged.SerializeToString(), feeds)
    except Exception as exc:  # noqa: BLE001 - find which probe the engine refuses
        bad = []
        for g in graphs:
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
            m.ir_version = 10
            try:
                _run_engine(engine, m.SerializeToString(), {i.name: feeds[i.name] for i in g.input})
            except Exception as e:  # noqa: BLE001
                bad.append(f"{g.output[0].name}: {str(e).splitlines()[0][:100]}")
        pytest.fail(f"{engine} cannot run probes it accepts: {bad or exc}")
    tol = backend.tolerance
    wrong = []
    for out, g, w in zip(merged.graph.output, got, want):
        if g.dtype != w.dtype or g.shape != w.shape:
            wrong.append(f"{out.name}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}")
        elif w.dtype.kind == "f" and not np.allclose(g, w, rtol=tol.rtol, atol=tol.atol):
            wrong.append(f"{out.name}: max abs error {np.max(np.abs(g - w)):.3g}")
        elif w.dtype.kind != "f" and not np.array_equal(g, w):
            wrong.append(f"{out.name}: {np.ravel(g)[:3]} vs {np.ravel(w)[:3]}")
    assert not wrong, f"{engine} differs from the ONNX reference on probes it accepts: {wrong}"


@pytest.mark.fast
@pytest.mark.parametrize("backend", sorted(GRAPH_BACKENDS))
def test_complex_is_refused(backend):
    """No graph backend takes complex numbers (ONNX has no complex type; XLA's differ from IREE's)."""
    from collage_mlir.ir import parse_module

    T = "tensor<4xcomplex<f32>>"
    module = parse_module(f"func.func @f(%p: tensor<4xi1>, %a: {T}, %b: {T}) -> {T} {{\n"
                          f"  %0 = stablehlo.select %p, %a, %b : tensor<4xi1>, {T}\n  return %0 : {T}\n}}",
                          new_context())
    op = module.body.operations[0].regions[0].blocks[0].operations[0].operation
    assert "complex" in (get_backend(backend).supports(op) or "")
