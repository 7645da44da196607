"""openvino-bf16: OpenVINO with bf16 inference precision, an opt-in backend where the CPU has bf16.

Its regions must compute what bf16 inputs with f32 sums compute (not f32, not another rounding), within the
tolerance the backend states of f32; `--precision bf16` adds it to a tune, and where the CPU lacks bf16 it is
one line naming why.
"""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest

import collage_runtime
from collage_mlir.backends import get_backend, registry
from collage_mlir.errors import CollageError
from collage_mlir.frontends.onnx_calibrate import HeldOut
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module

MATMUL = """
func.func @main(%x: tensor<64x512xf32>, %w: tensor<512x64xf32>) -> tensor<64x64xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x64xf32>) -> tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
"""


def _bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bf16 (nearest, ties to even), as f64."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def bf16_backend():
    pytest.importorskip("openvino")
    info = registry()["openvino-bf16"]
    if info.problem:
        pytest.skip(f"openvino-bf16 is not usable here: {info.problem}")
    return info.backend


def test_regions_compute_bf16_products_with_f32_sums(bf16_backend, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    w = rng.standard_normal((512, 64)).astype(np.float32)
    art = compile_module(parse_module(MATMUL, new_context()), "prefer:openvino-bf16", tmp_path)
    (region,) = art.manifest.regions
    assert region.backend == "openvino-bf16" and region.executor.endswith("openvino_bf16_model")
    with collage_runtime.load(art.out_dir) as program:
        (got,) = [np.asarray(y) for y in program.invoke("main", x, w)]
    exact = x.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(exact).max()
    error = np.abs(got - exact).max() / scale
    tol = bf16_backend.tolerance
    assert error <= tol.rtol, "beyond the tolerance the backend states"
    assert error > 1e-4, "as close to f32 as an f32 engine: the region did not run in bf16"
    # bf16 inputs, f64 sums: what the engine computes, up to its f32 sums' rounding.
    assert np.abs(got - _bf16(x) @ _bf16(w)).max() / scale < 1e-5


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"backends": "ort,iree-cpu", "precision": None, **kw})


@pytest.mark.fast
def test_precision_bf16_adds_the_bf16_backends_to_a_tune(bf16_backend):
    from collage_mlir.tools.tune_cmd import backends_for

    with new_context() as ctx:
        module = parse_module(MATMUL, ctx)
        assert [b.name for b in backends_for(_args(), module)] == ["ort", "iree-cpu"]
        assert [b.name for b in backends_for(_args(precision="bf16"), module)] == ["ort", "iree-cpu", "openvino-bf16"]
        assert "openvino-bf16" not in [b.name for b in backends_for(_args(backends=None), module)]  # opt-in


@pytest.mark.fast
def test_a_bf16_model_is_tuned_over_the_bf16_backends_unless_f32_is_asked(bf16_backend):
    """The default precision is the model's own: a model whose products take bf16 (a JAX model cast to
    bf16; a torch one, whose matmuls torch-mlir widens first) gets the bf16 backends without a flag;
    `--precision f32` keeps them out; an f32 model does not."""
    from collage_mlir.dialects.stablehlo import stated_format
    from collage_mlir.tools.tune_cmd import backends_for
    from collage_runtime.types import NumberFormat

    with new_context() as ctx:
        bf16 = parse_module(MATMUL.replace("x512xf32", "x512xbf16").replace("512x64xf32", "512x64xbf16"), ctx)
        assert stated_format(bf16) is NumberFormat.BF16
        assert stated_format(parse_module(MATMUL, ctx)) is NumberFormat.F32
        widened = parse_module("""
        func.func @main(%x: tensor<64x512xbf16>, %w: tensor<512x64xbf16>) -> tensor<64x64xf32> {
          %a = stablehlo.convert %x : (tensor<64x512xbf16>) -> tensor<64x512xf32>
          %b = stablehlo.convert %w : (tensor<512x64xbf16>) -> tensor<512x64xf32>
          %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x64xf32>) -> tensor<64x64xf32>
          return %0 : tensor<64x64xf32>
        }""", ctx)
        assert stated_format(widened) is NumberFormat.BF16  # torch-mlir's bf16 matmul: products of bf16 values
        assert [b.name for b in backends_for(_args(), bf16)] == ["ort", "iree-cpu", "openvino-bf16"]
        assert [b.name for b in backends_for(_args(precision="f32"), bf16)] == ["ort", "iree-cpu"]


@pytest.mark.fast
def test_precision_bf16_without_bf16_here_is_one_line(monkeypatch):
    from collage_mlir.backends import BackendInfo
    from collage_mlir.tools.tune_cmd import backends_for

    pytest.importorskip("openvino")
    info = registry()["openvino-bf16"]
    why = "this CPU has no bf16 arithmetic (AVX-512 BF16 or AMX)"
    lacking = {**registry(), "openvino-bf16": BackendInfo("openvino-bf16", info.backend, why)}
    monkeypatch.setattr("collage_mlir.search.registry", lambda: lacking)
    with pytest.raises(CollageError, match=r"no backend computes in bf16 here \(openvino-bf16: this CPU has no "
                                           r"bf16 arithmetic"):
        with new_context() as ctx:
            backends_for(_args(precision="bf16"), parse_module(MATMUL, ctx))


@pytest.mark.fast
def test_compile_precision_bf16_needs_a_tune(tmp_path, capsys):
    from collage_mlir.tools.cli import main

    model = tmp_path / "m.mlir"
    model.write_text(MATMUL)
    assert main(["compile", str(model), "--precision", "bf16", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--precision bf16 lets a tune place regions on bf16 backends" in err and err.count("\n") == 1
    assert get_backend("openvino").computes_in is None


def test_a_bf16_program_is_checked_on_held_out_digits(bf16_backend, tmp_path):
    """`collage compile f32.onnx --plan whole:openvino-bf16 --held-out DATA --max-drop X`: the program against
    the f32 model on the samples, reported (bf16: some error, no class changed on a trained CNN); above
    --max-drop nothing is written."""
    import subprocess
    import sys

    import torch

    from models import digits_cnn

    model, x, labels = digits_cnn()
    torch.onnx.export(model, torch.tensor(x[:64]), str(tmp_path / "f32.onnx"), dynamo=False, input_names=["x"],
                      opset_version=17)
    np.save(tmp_path / "held.npy", x[1400:1784])

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "compile", str(tmp_path / "f32.onnx"),
                               "--plan", "whole:openvino-bf16", "--held-out", str(tmp_path / "held.npy"), *args],
                              capture_output=True, text=True)

    r = cli("--max-drop", "0.01", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    line = " ".join(r.stderr.split())
    found = re.search(r"the program against f32 on 384 held-out samples: top class changed on ([\d.]+) %, max error "
                      r"([\d.]+) % of the output's scale", line)
    assert found, line
    assert float(found[1]) <= 1.0 and 0 < float(found[2]) < 100 * bf16_backend.tolerance.rtol
    with collage_runtime.load(tmp_path / "out") as program:
        got = np.concatenate([program.invoke("main", x[i:i + 64])[0] for i in range(1400, 1784, 64)])
    assert (got.argmax(1) == labels[1400:1784]).mean() > 0.9
    # Samples of a wrong shape: one line, nothing written.
    np.save(tmp_path / "held.npy", x[1400:1784, :, :4])
    r = cli("-o", str(tmp_path / "bad"))
    assert r.returncode != 0 and "input 'x' takes [64, 1, 8, 8]" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad").exists()


DYNAMIC = """
func.func @main(%x: tensor<?x512xf32>, %w: tensor<512x64xf32>) -> tensor<?x64xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<?x512xf32>, tensor<512x64xf32>) -> tensor<?x64xf32>
  return %0 : tensor<?x64xf32>
}
"""


def test_bf16_buckets_beside_an_f32_fallback(bf16_backend, tmp_path):
    """`collage compile model.mlir --dim 0.0=1:4:8 --plan whole:openvino-bf16`: the fallback (f32, on the module
    with its dims) is checked against the bf16 bucket within the bucket plan's tolerance (it was refused with
    the import check's f32 tolerance), and both serve within it."""
    from collage_mlir.tools.cli import main
    from collage_runtime.shaped import ShapedProgram

    (tmp_path / "m.mlir").write_text(DYNAMIC)
    out = tmp_path / "out"
    assert main(["compile", str(tmp_path / "m.mlir"), "--dim", "0.0=1:4:8", "--bucket", "0.0=4,8", "--plan",
                 "whole:openvino-bf16", "-o", str(out)]) == 0
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 64)).astype(np.float32)
    with ShapedProgram(out) as program:
        for rows, served in ((4, "bucket 0.0=4"), (3, "fallback")):
            x = rng.standard_normal((rows, 512)).astype(np.float32)
            assert served in program.served(x, w)
            got = np.asarray(program.invoke("main", x, w)[0])
            exact = x.astype(np.float64) @ w
            assert np.abs(got - exact).max() <= bf16_backend.tolerance.rtol * np.abs(exact).max()


def _dynamic_onnx(path, w: np.ndarray) -> None:
    """x[batch, 512] @ w as an ONNX model whose batch is a dim_param."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))


def test_precision_bf16_lets_the_fallback_run_in_bf16(bf16_backend, tmp_path, capsys):
    """With --precision bf16 the engines timed for the shapes between buckets include OpenVINO in bf16;
    `--fallback openvino-bf16` serves them in bf16 (within its tolerance, not as f32 does)."""
    from collage_mlir.tools.cli import main
    from collage_runtime.shaped import ShapedProgram
    from collage_runtime.shapes import Fallback

    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 64)).astype(np.float32)
    _dynamic_onnx(tmp_path / "m.onnx", w)
    common = [str(tmp_path / "m.onnx"), "--dim", "batch=1:4:8", "--bucket", "batch=4,8", "--plan",
              "whole:openvino-bf16", "--precision", "bf16"]
    assert main(["compile", *common, "-o", str(tmp_path / "auto")]) == 0
    timed = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("between buckets:"))
    assert all(f"{k} " in timed for k in ("ort", "openvino", "openvino-bf16")), timed
    assert main(["compile", *common, "--fallback", "openvino-bf16", "-o", str(tmp_path / "out")]) == 0
    x = rng.standard_normal((3, 512)).astype(np.float32)
    with ShapedProgram(tmp_path / "out") as program:
        assert program.table.fallback is Fallback.OPENVINO_BF16 and program.served(x) == "openvino-bf16 fallback"
        got = np.asarray(program.invoke("main", x)[0])
    exact = x.astype(np.float64) @ w
    error = np.abs(got - exact).max() / np.abs(exact).max()
    assert 1e-4 < error <= bf16_backend.tolerance.rtol


def test_a_tuned_bf16_plan_above_max_drop_reverts_to_full_precision(bf16_backend, tmp_path, capsys):
    """`collage tune --precision bf16 --held-out DATA --max-drop X`: the tuned plan's program is checked on the
    samples; where its bf16 regions change more top classes than X, the tune runs again without the bf16
    backends and that plan is checked. A model whose ten logits differ by less than bf16 resolves (columns of
    its weight 1e-4 apart): f32 picks the last class, bf16 ties them all."""
    import types

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.ir import new_context
    from collage_mlir.search import resolve_plan
    from collage_mlir.tools.tune_cmd import _within_max_drop, parse_backends

    rng = np.random.default_rng(0)
    # bf16 values in [1, 2) (spaced 2^-7 there), then 1e-4 apart per column: in bf16 the columns are one.
    base = _bf16(rng.choice([-1.0, 1.0], (512, 1)) * rng.uniform(1.0, 2.0, (512, 1))).astype(np.float32)
    w = base + 1e-4 * np.arange(10, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 10])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              str(tmp_path / "m.onnx"))
    np.save(tmp_path / "held.npy", rng.uniform(0.5, 1.5, (64, 512)).astype(np.float32))
    module = load_model(tmp_path / "m.onnx", new_context())
    number_ops(module)
    plan = {b: resolve_plan(f"whole:{b}", Graph(module)) for b in ("openvino-bf16", "ort")}
    searched = []

    def search(chosen):
        searched.append([b.name for b in chosen])
        return types.SimpleNamespace(plan=plan["ort"])

    args = argparse.Namespace(model=str(tmp_path / "m.onnx"))
    held = HeldOut(tmp_path / "held.npy", max_drop=0.0)
    backends = parse_backends("ort,openvino-bf16")
    bytes_ = module.operation.get_asm(binary=True)
    kept, agreement = _within_max_drop(args, types.SimpleNamespace(plan=plan["openvino-bf16"]), bytes_, held,
                                       backends, search)
    assert kept.plan is plan["ort"] and searched == [["ort"]] and agreement.top1_changed == 0.0
    # The tune's report shows it beside the timings.
    from collage_mlir.tools.report_cmd import render

    page = render(kept.plan.to_json(), None, None, None, held_out=agreement.to_json() | {"max_drop": 0.0})
    assert "<h2>Accuracy</h2><p>the program against f32 on 64 held-out samples: top class changed on 0.0 %" in page
    assert "(bound: --max-drop 0)" in page
    err = " ".join(capsys.readouterr().err.split())
    assert "tuned plan: the program against f32 on 64 held-out samples: top class changed on 100.0 %" in err
    assert "above --max-drop 0: the plan's regions on openvino-bf16 revert to the model's precision" in err
    assert "top class changed on 0.0 %" in err
    # A plan with no bf16 region that misses the bound: one error, no second search.
    with pytest.raises(CollageError, match=r"top class changed on 100.0 %.*above --max-drop 0; no plan was written"):
        _within_max_drop(args, types.SimpleNamespace(plan=plan["openvino-bf16"]), bytes_, held,
                         parse_backends("ort"), search)
    assert searched == [["ort"]]


def test_a_torch_bf16_bert_is_right_on_openvino_bf16(bf16_backend, tmp_path):
    """A BERT cast to bf16 in torch (the zoo's small `bert_base_bf16`), whole on openvino-bf16, within 5e-2 of
    scale of the same whole on ONNX Runtime (f32 math). OpenVINO computed its bf16 output 78 % off in bf16 mode; read as f32
    (`openvino_model._f32_outputs`) and converted into the bf16 buffer, it is right."""
    from collage_mlir import zoo

    xs = zoo.numpy_inputs("bert_base_bf16", small=True)
    outs = {}
    for plan in ("whole:ort", "whole:openvino-bf16"):
        compile_module(zoo.import_stablehlo("bert_base_bf16", new_context(), small=True), plan, tmp_path / plan,
                       source="bert_base_bf16")
        with collage_runtime.load(tmp_path / plan) as program:
            outs[plan] = np.asarray(program.invoke("main", *xs)[0]).astype(np.float32)
    want = outs["whole:ort"]
    assert np.abs(outs["whole:openvino-bf16"] - want).max() <= 5e-2 * np.abs(want).max()
