"""The import check (``collage_mlir.measure.import_check``): an imported model must compute what its source
computes before anything is built on it. Five ONNX node tests torch-mlir lowers wrongly (exit 0 with wrong
numbers before the check) now fail ``collage compile model.onnx`` in one line naming the output and the
node; correct ONNX, torch and JAX imports pass (the verdict cached); a source that computes other numbers
(monkeypatched) fails the torch and JAX entry points too."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from collage_mlir.errors import CollageError  # noqa: E402
from collage_mlir.frontends import load_model  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.measure.import_check import (  # noqa: E402
    ImportMismatch, check_inputs, check_model_file, compare, data_arguments)
from collage_mlir.tools import cli  # noqa: E402

from helpers import CONFORMANCE

sys.path.insert(0, str(CONFORMANCE))
from onnx_nodes import node_cases, write_case  # noqa: E402

#: (ONNX node test, the op module that builds it, output name, op type): wrong with exit 0 before the check.
WRONG = [("test_mod_mixed_sign_int16", "mod", "z", "Mod"),
         ("test_spacetodepth_crd_mode_example", "spacetodepth", "y", "SpaceToDepth"),
         ("test_reduce_max_bool_inputs", "reducemax", "reduced", "ReduceMax"),
         ("test_lppool_3d_default", "lppool", "y", "LpPool"),
         ("test_maxpool_3d_dilations_use_ref_impl_large", "maxpool", "y", "MaxPool")]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    built = node_cases(sorted({m for _, m, _, _ in WRONG}))
    root = tmp_path_factory.mktemp("cases")
    return {name: write_case(built[name], root) for name, _, _, _ in WRONG}


def _compile_args(d: Path, out: Path, *extra: str) -> list[str]:
    inputs = [a for p in sorted(d.glob("in_*.npy")) for a in ("--input", str(p))]
    return ["compile", str(d / "model.onnx"), *inputs, "-o", str(out), *extra]


def test_a_wrong_lowering_is_kept_as_onnx(cases, tmp_path):
    """Through the console entry point: the check finds the Mod node computed wrong, keeps it as ONNX (on
    ONNX Runtime inside the program) and checks again; the program gives ONNX's expected outputs."""
    import json

    d = cases["test_mod_mixed_sign_int16"]
    r = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *_compile_args(d, tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    regions = json.loads((tmp_path / "out" / "manifest.json").read_text())["regions"]
    assert [r["backend"] for r in regions] == ["ort"], regions
    inputs = [a for p in sorted(d.glob("in_*.npy")) for a in ("--input", str(p))]
    r = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "run", str(tmp_path / "out"), *inputs,
                        "--output-dir", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out_0.npy"), np.load(d / "want_0.npy"))


def test_a_lowering_wrong_also_when_kept_is_one_line(cases, tmp_path, capsys):
    """SpaceToDepth in CRD mode (opset 28): ONNX Runtime cannot read it, and the kept node at an older opset
    computes DCR: the check fails again, and its first line stands (output, node; exit 1, no artifact)."""
    assert cli.main(_compile_args(cases["test_spacetodepth_crd_mode_example"], tmp_path / "out")) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("collage: error: "), err
    assert "output 0 'y'" in err and "first differing node: SpaceToDepth" in err, err
    assert not (tmp_path / "out").exists()


# The Mod case is ``-m bench`` here: test_the_first_differing_node_of_a_chain checks a Mod node is named.
@pytest.mark.parametrize("name,module,output,op", [
    pytest.param(*w, marks=[pytest.mark.bench] if w[0] == "test_mod_mixed_sign_int16" else []) for w in WRONG],
    ids=[w[0] for w in WRONG])
def test_each_wrong_lowering_names_its_output_and_node(name, module, output, op, cases):
    """The check alone (``check_model_file``: no node kept) refuses each in one line naming output and node."""
    d = cases[name]
    inputs = [np.load(p) for p in sorted(d.glob("in_*.npy"))]
    with pytest.raises(ImportMismatch) as err:
        check_model_file(load_model(d / "model.onnx", new_context(), isolated=False), d / "model.onnx", inputs,
                         cache=False)
    assert "\n" not in str(err.value) and f"output 0 '{output}'" in str(err.value), err.value
    assert f"first differing node: {op}" in str(err.value) and err.value.node.outputs == (output,), err.value


def test_no_import_check_compiles_it_anyway(cases, tmp_path):
    assert cli.main(_compile_args(cases["test_mod_mixed_sign_int16"], tmp_path / "out", "--no-import-check")) == 0


def _onnx_model(path: Path, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_the_first_differing_node_of_a_chain(tmp_path):
    """Neg, then the wrongly lowered Mod, then Abs: the node named is the Mod, not the output's Abs."""
    i16 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT16, [6])  # noqa: E731
    path = _onnx_model(tmp_path / "chain.onnx",
                       [helper.make_node("Neg", ["x"], ["n"], name="neg"),
                        helper.make_node("Mod", ["n", "y"], ["m"], name="mod"),
                        helper.make_node("Abs", ["m"], ["z"], name="abs")], [i16("x"), i16("y")], [i16("z")])
    x = np.array([-4, -7, 5, 4, -2, 3], np.int16)
    y = np.array([2, -3, 8, -2, 3, 5], np.int16)
    with pytest.raises(CollageError, match=r"output 0 'z': .*first differing node: 'mod' \(Mod\)") as err:
        check_model_file(load_model(path, new_context(), isolated=False), path, [x, y], cache=False)
    assert "\n" not in str(err.value) and "(onnxruntime)" in str(err.value)


def test_a_correct_onnx_model_passes_and_its_verdict_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w", (4, 3, 3, 3)), ("fc", (4 * 6 * 6, 10))]]
    path = _onnx_model(tmp_path / "cnn.onnx",
                       [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
                        helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "fc"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], inits)
    # The checks' own imports, in this process (the isolated import is the CLI tests' above: ~4 s each).
    first = check_model_file(load_model(path, new_context(), isolated=False), path)  # generated inputs
    assert first.ok and not first.cached and first.source == "onnxruntime"
    assert [o.name for o in first.outputs] == ["y"] and first.outputs[0].max_error < 1e-3
    again = check_model_file(load_model(path, new_context(), isolated=False), path)
    assert again.ok and again.cached and again.outputs == first.outputs


@pytest.mark.fast
def test_a_stablehlo_file_has_no_source_to_check(tmp_path):
    path = tmp_path / "m.mlir"
    path.write_text("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }\n")
    assert check_model_file(load_model(path, new_context()), path) is None


@pytest.mark.fast
def test_compare_rules():
    f32 = np.array([1.0, 100.0, np.nan, np.inf], np.float32)
    assert compare(0, "y", f32 + np.float32(0.005), f32).ok  # 1e-4 of the magnitude (100) absorbs it
    assert not compare(0, "y", f32 + np.float32(0.05), f32).ok
    assert not compare(0, "y", np.array([1.0, 100.0, 0.0, np.inf], np.float32), f32).ok  # NaN must stay NaN
    assert not compare(0, "y", np.array([1.0, 100.0, np.nan, -np.inf], np.float32), f32).ok
    f16 = np.array([1.0, 2.0], np.float16)
    assert compare(0, "y", f16 + np.float16(0.01), f16).ok and not compare(0, "y", f16 + np.float16(0.1), f16).ok
    ints = np.array([0, -2, 5], np.int16)
    assert compare(0, "y", ints, ints).ok and not compare(0, "y", ints + np.int16(1), ints).ok
    bad = compare(3, "y", ints.reshape(3, 1), ints)
    assert not bad.ok and bad.max_error == float("inf") and "int16[3, 1], the source gives int16[3]" in bad.detail
    demoted = compare(0, "y", f32, f32.astype(np.float64))
    assert not demoted.ok and "float32[4], the source gives float64[4]" in demoted.detail
    # A quantized model's spread (its engine's own two arithmetics differ by 0.1): twice that is allowed.
    assert compare(0, "y", f32 + np.float32(0.15), f32, spread=0.1).ok
    assert not compare(0, "y", f32 + np.float32(0.25), f32, spread=0.1).ok


def test_a_quantized_source_reports_its_spread(tmp_path):
    """ONNX Runtime runs a QDQ model twice, unfused and with its int8 kernels: the outputs' spread."""
    from collage_mlir.measure.import_check import run_onnx

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-127, 127, (64, 64)).astype(np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
         helper.make_node("DequantizeLinear", ["w", "ws", "z"], ["dw"]), helper.make_node("MatMul", ["d", "dw"], ["m"]),
         helper.make_node("QuantizeLinear", ["m", "ys", "z"], ["qy"]), helper.make_node("DequantizeLinear", ["qy", "ys", "z"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])],
        [w, numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
         numpy_helper.from_array(np.array(0.05, np.float32), "ys"), numpy_helper.from_array(np.array(0, np.int8), "z")])
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    ran = run_onnx(str(path), [rng.standard_normal((8, 64)).astype(np.float32)])
    # At least one step of the output's own quantizer (0.05): a value at its rounding boundary moves a step.
    assert ran.spread is not None and len(ran.spread) == 1 and 0.05 <= ran.spread[0] <= 0.05 * 2
    # Values just past a rounding boundary: the run with its quantize scales nudged (1e-5 of themselves) moves
    # them one step (0.02), as an engine's other arithmetic may; both ONNX Runtime runs agree on them. (A Relu
    # writes the output: no quantizer's step of its own.)
    pair = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
         helper.make_node("Relu", ["d"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        [numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")])
    onnx.save(helper.make_model(pair, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "pair.onnx")
    edge = ((np.arange(8) + 0.5) * 0.02 * (1 + 2e-6)).astype(np.float32)
    assert run_onnx(str(tmp_path / "pair.onnx"), [edge]).spread[0] == pytest.approx(0.02, rel=1e-3)
    plain = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    assert run_onnx(str(tmp_path / "f.onnx"), [np.ones(4, np.float32)]).spread is None


def test_torch_import_checked_against_eager(torch, tmp_path, monkeypatch):
    import collage_mlir.torch as ctorch

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
    x = torch.randn(3, 8)
    compiled = ctorch.compile(model, [x])  # the import is right: checked, passes
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    real = ctorch.torch_source  # another digest: not the verdict cached just now
    monkeypatch.setattr(ctorch, "torch_source",
                        lambda m, inputs, result: replace(real(m, inputs, result * 2), digest="doubled"))
    with pytest.raises(CollageError, match=r"torch:Sequential: .*\(torch eager\): output 0: max error") as err:
        ctorch.compile(model, [x])
    assert "\n" not in str(err.value)
    ctorch.compile(model, [x], check_import=False)  # the user knows what they do (the artifact: cached)


def test_jax_function_checked_against_jit(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import collage_mlir.jax as cjax

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))

    def f(x, w):
        return {"h": jnp.tanh(x @ w), "n": jnp.sum(x)}

    x, w = np.ones((4, 8), np.float32), np.eye(8, dtype=np.float32)
    np.testing.assert_allclose(cjax.compile(f, x, w)(x, w)["h"], np.tanh(x @ w), rtol=1e-5)
    real = cjax.jax_source  # another digest: not the verdict cached just now
    monkeypatch.setattr(cjax, "jax_source", lambda fn, args: replace(
        real(lambda *a: {"h": fn(*a)["h"], "n": fn(*a)["n"] + 1}, args), digest="plus one"))
    with pytest.raises(CollageError, match=r"jax:f: .*\(jax.jit\): output 1 '\['n'\]': max error 1") as err:
        cjax.compile(f, x, w)
    assert "\n" not in str(err.value)


def test_unsigned_compares_run_on_xla(tmp_path):
    """torch-mlir lowers a uint8 comparison with compare_type SIGNED, which XLA's verifier refused at the
    region's first call (ONNX's test_greater_equal_uint8 under random plans); the frontend makes it UNSIGNED."""
    pytest.importorskip("jax")
    import collage_runtime

    u8 = lambda n: helper.make_tensor_value_info(n, TensorProto.UINT8, [4])  # noqa: E731
    path = _onnx_model(tmp_path / "ge.onnx", [helper.make_node("GreaterOrEqual", ["x", "y"], ["z"])], [u8("x"), u8("y")],
                       [helper.make_tensor_value_info("z", TensorProto.BOOL, [4])])
    x, y = np.array([200, 5, 130, 0], np.uint8), np.array([100, 5, 1, 255], np.uint8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert cli.main(["compile", str(path), "--input", str(tmp_path / "x.npy"), "--input", str(tmp_path / "y.npy"),
                     "--plan", "prefer:xla-cpu", "-o", str(tmp_path / "out")]) == 0
    with collage_runtime.load(tmp_path / "out") as prog:
        assert [r.backend for r in prog.manifest.regions] == ["xla-cpu"]
        (z,) = prog.invoke("main", x, y)
    np.testing.assert_array_equal(z, x >= y)


def test_generated_integers_take_both_signs_where_they_are_data(tmp_path):
    """No example inputs: a signed integer that only meets arithmetic gets negative values too, so the
    wrong mixed-sign Mod fails the check; a gather's indices stay non-negative."""
    i16 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT16, [16])  # noqa: E731
    path = _onnx_model(tmp_path / "mod.onnx", [helper.make_node("Mod", ["x", "y"], ["z"], name="mod")],
                       [i16("x"), i16("y")], [i16("z")])
    with pytest.raises(CollageError, match=r"first differing node: 'mod' \(Mod\)"):
        check_model_file(load_model(path, new_context(), isolated=False), path, cache=False)
    gather = _onnx_model(tmp_path / "gather.onnx", [helper.make_node("Gather", ["t", "i"], ["g"])],
                         [helper.make_tensor_value_info("t", TensorProto.FLOAT, [5, 3]),
                          helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                         [helper.make_tensor_value_info("g", TensorProto.FLOAT, [4, 3])])
    module = load_model(gather, new_context(), isolated=False)
    assert data_arguments(module) == set()
    (_, indices) = check_inputs(module, None)
    assert indices.min() >= 0
    check_model_file(module, gather, cache=False)
