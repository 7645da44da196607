"""StableHLO modules with dynamic dims (``frontends.refine``): a jax.export module's axes take its symbols
(axes asserted equal share one), any other ``?`` axis is ARG.AXIS; a bucket's module is static and computes
what jax does at that shape; shapes the module rejects are one line each."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from collage_mlir.errors import CollageError
from collage_mlir.frontends.refine import load, module_axes
from collage_mlir.ir import ir, new_context, parse_module

jax = pytest.importorskip("jax")
jnp = jax.numpy

HAND_WRITTEN = """
func.func @main(%a: tensor<?x4xf32>, %b: tensor<?x4xf32>, %w: tensor<4x2xf32>) -> tensor<?x2xf32> {
  %0 = stablehlo.add %a, %b : tensor<?x4xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<?x4xf32>, tensor<4x2xf32>) -> tensor<?x2xf32>
  return %1 : tensor<?x2xf32>
}
"""


def net(x, mask):
    """A JAX user's block: a dense layer, GELU, a reshape that depends on the batch, a masked sum."""
    w = jnp.asarray(np.random.default_rng(0).standard_normal((16, 8)), jnp.float32)
    h = jax.nn.gelu(x @ w).reshape(x.shape[0], 2, 4)
    return (h.sum(-1) * mask).sum(-1)


def exported_text() -> str:
    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(net))(jax.ShapeDtypeStruct((b, 16), jnp.float32),
                                               jax.ShapeDtypeStruct((b, 2), jnp.float32))
    return exported.mlir_module()


def argument_types(module: ir.Module) -> list[str]:
    main = next(op for op in module.body.operations if op.operation.name == "func.func")
    return [str(t) for t in ir.FunctionType(ir.TypeAttr(main.operation.attributes["function_type"]).value).inputs]


@pytest.mark.fast
def test_axes_are_named_by_the_exports_symbols_else_by_argument_and_axis():
    assert module_axes(parse_module(exported_text(), new_context())) == (("b", None), ("b", None))
    assert module_axes(parse_module(HAND_WRITTEN, new_context())) == (("0.0", None), ("1.0", None), (None, None))
    # A module without @main has no dims (and loads as it is: its public functions are compiled as they are).
    assert module_axes(parse_module(HAND_WRITTEN.replace("@main", "@forward"), new_context())) == ()


@pytest.mark.fast
def test_a_bucket_is_static_and_rejected_shapes_are_one_line(tmp_path):
    path = tmp_path / "net.mlir"
    path.write_text(exported_text())
    module = load(path, new_context(), {"b": 3})
    assert argument_types(module) == ["tensor<3x16xf32>", "tensor<3x2xf32>"]
    # No shape assertion, nor the constants refinement leaves of them (a dead i1 constant broke a later tune).
    assert "?" not in str(module) and "shape_assertion" not in str(module) and "i1>" not in str(module)
    # The same from example inputs' shapes; neither: the line that names the dim and the flag.
    assert argument_types(load(path, new_context(), inputs=[np.zeros((5, 16)), np.zeros((5, 2))]))[0] == \
        "tensor<5x16xf32>"
    with pytest.raises(CollageError, match=r"dynamic dims: b \(@main argument 0 axis 0\), b \(@main argument 1 "
                                           r"axis 0\); declare each one's range with --dim"):
        load(path, new_context())
    # jax.export's own assertion (b >= 1), and axes the module needs equal given two sizes.
    with pytest.raises(CollageError, match=r"at b=0: the module does not refine to static shapes: .*Expected "
                                           r"value >= 1 for dimension variable 'b'") as err:
        load(path, new_context(), {"b": 0})
    assert "\n" not in str(err.value)
    # A JAX function calling the exported module, lowered as jax lowers it: static @main, dynamic inside.
    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(net))(jax.ShapeDtypeStruct((b, 16), jnp.float32),
                                               jax.ShapeDtypeStruct((b, 2), jnp.float32))
    (tmp_path / "caller.mlir").write_text(jax.jit(exported.call).lower(np.zeros((4, 16), np.float32),
                                                                       np.zeros((4, 2), np.float32)).as_text())
    assert "tensor<?" in (tmp_path / "caller.mlir").read_text()
    assert "?" not in str(load(tmp_path / "caller.mlir", new_context()))
    (tmp_path / "hand.mlir").write_text(HAND_WRITTEN)
    with pytest.raises(CollageError, match=r"at 0.0=3,1.0=4: .*'stablehlo.add' op requires the same shape"):
        load(tmp_path / "hand.mlir", new_context(), {"0.0": 3, "1.0": 4})


def test_compile_a_jax_export_with_dims_and_run_every_shape(tmp_path):
    """`collage compile net.mlir --dim b=...  --pad b` (the jax.export module as text), then the artifact at
    bucket shapes and a padded one equals jax (rtol 1e-5, atol 1e-5); out of range is one line."""
    import collage_runtime
    from collage_mlir.tools.cli import main as collage

    path = tmp_path / "net.mlir"
    path.write_text(exported_text())
    assert collage(["compile", str(path), "--dim", "b=1:2:4", "--bucket", "b=2,4", "--pad", "b",
                    "-o", str(tmp_path / "art")]) == 0
    rng = np.random.default_rng(1)
    with collage_runtime.load(tmp_path / "art") as program:
        for batch in (2, 3, 4):
            x, mask = rng.standard_normal((batch, 16), np.float32), rng.standard_normal((batch, 2), np.float32)
            (got,) = program.invoke("main", x, mask)
            np.testing.assert_allclose(got, net(x, mask), rtol=1e-5, atol=1e-5)
    np.save(tmp_path / "x.npy", np.zeros((5, 16), np.float32))
    np.save(tmp_path / "m.npy", np.zeros((5, 2), np.float32))
    run = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "run", str(tmp_path / "art"), "--input",
                          str(tmp_path / "x.npy"), "--input", str(tmp_path / "m.npy")], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "dim 'b') is 5, outside the declared range 1..4" in run.stderr


def test_jax_jit_of_an_exported_function_takes_its_symbols(monkeypatch):
    """`collage_mlir.jax.jit(exported, dims={"b": ...}, pad=["b"])`: buckets compiled once, shapes between them
    padded; without pad, run by IREE's dynamic program; equal to jax (rtol 1e-5, atol 1e-5)."""
    import collage_mlir.jax

    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(net))(jax.ShapeDtypeStruct((b, 16), jnp.float32),
                                               jax.ShapeDtypeStruct((b, 2), jnp.float32))
    run = collage_mlir.jax.jit(exported, dims={"b": (1, 2, 4)}, pad=["b"])
    rng = np.random.default_rng(2)
    for batch in (3, 1):
        x, mask = rng.standard_normal((batch, 16), np.float32), rng.standard_normal((batch, 2), np.float32)
        np.testing.assert_allclose(run(x, mask), net(x, mask), rtol=1e-5, atol=1e-5)
    # Without pad: IREE's dynamic program of the exported module between buckets, nothing compiled per shape.
    import collage_mlir.jax as entry

    compiled, real_compile = [], entry._compile  # (fn, example arguments, options, int8)
    monkeypatch.setattr(entry, "_compile", lambda *a: compiled.append(a[1]) or real_compile(*a))
    dynamic = collage_mlir.jax.jit(exported, dims={"b": (1, 2, 8)})
    for batch in (3, 5, 1, 8):
        x, mask = rng.standard_normal((batch, 16), np.float32), rng.standard_normal((batch, 2), np.float32)
        np.testing.assert_allclose(dynamic(x, mask), net(x, mask), rtol=1e-5, atol=1e-5)
    assert sorted(np.shape(a[0])[0] for a in compiled) == [1, 2, 8]  # the buckets alone
    with pytest.raises(CollageError, match="'c' is not a dynamic dim of the model"):
        collage_mlir.jax.jit(exported, dims={"c": (1, 2, 4)})(np.zeros((2, 16), np.float32),
                                                             np.zeros((2, 2), np.float32))


def test_shapes_between_buckets_run_with_the_dims_kept(tmp_path, monkeypatch, capsys):
    """Without --pad, an engine that takes the module with its `?` dims kept serves the shapes between
    buckets: IREE's program of it (`refine.for_iree`: jax.export's dynamic reshape and broadcasts in the form
    IREE takes), or its ONNX translation with dynamic dims on ONNX Runtime or OpenVINO (`shaped.dynamic_onnx`),
    by default the fastest, timed. Equal to jax (rtol 1e-5, atol 1e-5) at buckets and between them, results
    outliving later calls. A module IREE cannot compile dynamic and a fallback that disagrees with a bucket
    are one line each."""
    import collage_runtime
    import collage_mlir.shaped
    from collage_mlir.tools.cli import main as collage

    path = tmp_path / "net.mlir"
    path.write_text(exported_text())
    rng = np.random.default_rng(3)
    kept = []
    for engine in ("iree", "openvino", "auto"):
        art = tmp_path / engine
        assert collage(["compile", str(path), "--dim", "b=1:2:8", "--bucket", "b=2,8", "--fallback", engine,
                        "-o", str(art)]) == 0
        with collage_runtime.load(art) as program:
            between = program.table.fallback.value + " fallback"
            assert engine == "auto" or between == f"{engine} fallback"
            for batch, served in ((2, "bucket b=2"), (5, between), (1, between), (8, "bucket b=8")):
                x, mask = rng.standard_normal((batch, 16), np.float32), rng.standard_normal((batch, 2), np.float32)
                (got,) = program.invoke("main", x, mask)
                assert program.served(x, mask) == served
                np.testing.assert_allclose(got, net(x, mask), rtol=1e-5, atol=1e-5)
                kept.append((got.copy(), got))
        assert "between buckets: iree " in capsys.readouterr().err or engine != "auto"  # timed, all three
    for copy, got in kept:
        np.testing.assert_array_equal(got, copy)

    # Buckets on ONNX Runtime, their weights in the artifact's store: the check loads the staged artifact whole.
    b, = jax.export.symbolic_shape("b")
    w = jnp.asarray(np.random.default_rng(1).standard_normal((16, 64)), jnp.float32)  # 4 KiB: into weights.bin
    wide = tmp_path / "wide.mlir"
    wide.write_text(jax.export.export(jax.jit(lambda x: jnp.tanh(x @ w)))(
        jax.ShapeDtypeStruct((b, 16), jnp.float32)).mlir_module())
    assert collage(["compile", str(wide), "--dim", "b=1:2:8", "--bucket", "b=2,8", "--plan", "whole:ort",
                    "-o", str(tmp_path / "ort")]) == 0
    with collage_runtime.load(tmp_path / "ort") as program:
        x = rng.standard_normal((5, 16), np.float32)
        assert program.served(x).endswith(" fallback") and (tmp_path / "ort" / "weights.bin").exists()
        np.testing.assert_allclose(program.invoke("main", x)[0], np.tanh(x @ np.asarray(w)), rtol=1e-5, atol=1e-5)

    # Two symbols, a projection of a 3-d input and a batched matmul (IREE's own preprocessing flattens the
    # projection with a new dynamic reshape).
    b, s = jax.export.symbolic_shape("b, s")
    project = jnp.asarray(np.random.default_rng(2).standard_normal((8, 8)), jnp.float32)

    def attention(x):
        h = jnp.tanh(x @ project)
        return jax.nn.softmax(h @ h.transpose(0, 2, 1), axis=-1) @ h

    two = tmp_path / "two.mlir"
    two.write_text(jax.export.export(jax.jit(attention))(jax.ShapeDtypeStruct((b, s, 8), jnp.float32)).mlir_module())
    assert collage(["compile", str(two), "--dim", "b=1:1:4", "--dim", "s=2:2:8", "--fallback", "iree",
                    "-o", str(tmp_path / "two")]) == 0
    with collage_runtime.load(tmp_path / "two") as program:
        x = rng.standard_normal((3, 5, 8), np.float32)
        assert program.served(x) == "iree fallback"
        np.testing.assert_allclose(program.invoke("main", x)[0], attention(x), rtol=1e-5, atol=1e-5)

    capsys.readouterr()
    broadcast = tmp_path / "broadcast.mlir"  # a hand-written module: a `?` dim may expand, IREE cannot tell
    broadcast.write_text("""
func.func @main(%x: tensor<?xf32>, %s: tensor<2xi32>) -> tensor<?x4xf32> {
  %0 = stablehlo.dynamic_broadcast_in_dim %x, %s, dims = [0] : (tensor<?xf32>, tensor<2xi32>) -> tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}""")
    with pytest.raises(CollageError, match="IREE cannot compile the module with its dynamic dims"):
        collage_mlir.shaped.compile_file_shaped(
            broadcast, collage_mlir.frontends.dims.DimPlan.of([collage_mlir.frontends.dims.parse_dim("0.0=1:2:4")]),
            "default", tmp_path / "refused", fallback=collage_runtime.shapes.Fallback.IREE, check_import=False)
    assert not (tmp_path / "refused").exists()

    def other_model(model, values=None):  # a module that computes something else: the check must catch it
        wrong = tmp_path / "wrong.mlir"
        wrong.write_text(exported_text().replace("stablehlo.multiply", "stablehlo.add", 1))
        return real(wrong, values)

    real = collage_mlir.shaped._iree_dynamic
    monkeypatch.setattr(collage_mlir.shaped, "_iree_dynamic", other_model)
    assert collage(["compile", str(path), "--dim", "b=1:2:8", "--bucket", "b=2,8", "--fallback", "iree",
                    "-o", str(tmp_path / "wrong")]) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error" in line] == err.splitlines()[-1:]
    assert "the iree fallback disagrees with bucket b=2 at its shape: result 0: max error" in err
    assert not (tmp_path / "wrong").exists()


def test_dynamic_onnx_translation_keeps_the_dims_or_names_the_op_it_cannot_take():
    """`shaped.dynamic_onnx`: a jax.export module as ONNX with `?` dims (graph inputs' dim_params ARG.AXIS)
    runs on ONNX Runtime at any batch, equal to jax (rtol 1e-5, atol 1e-5); a sort over a dynamic batch has
    no dynamic rule: one line naming it."""
    import onnxruntime as ort

    from collage_mlir.shaped import dynamic_onnx

    model = dynamic_onnx(parse_module(exported_text(), new_context()), "net")
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == ["0.0", ""]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for batch in (1, 3, 7):
        x, mask = rng.standard_normal((batch, 16), np.float32), rng.standard_normal((batch, 2), np.float32)
        np.testing.assert_allclose(session.run(None, {"in0": x, "in1": mask})[0], net(x, mask), rtol=1e-5, atol=1e-5)
    b, = jax.export.symbolic_shape("b")
    conv = jax.export.export(jax.jit(lambda x: jnp.sort(x, axis=-1)))(
        jax.ShapeDtypeStruct((b, 8), jnp.float32)).mlir_module()
    with pytest.raises(CollageError, match="cannot export to ONNX: stablehlo.sort has no translation with dynamic dims"):
        dynamic_onnx(parse_module(conv, new_context()), "sort")
