"""JAX-made StableHLO through collage: private functions inlined at load with the public signature kept
(``frontends.stablehlo``), the reference run keeping JAX's result attributes, NHWC max pooling on the
ONNX engines, ``prefer:``/``whole:`` plans taking an engine's maximal regions, and a JAX module through
``collage tune``. Engines are compared with ``jax.jit`` at the backend's tolerance."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from collage_mlir import zoo
from collage_mlir.errors import CollageError
from collage_mlir.frontends import stablehlo
from collage_mlir.ir import new_context

CALLS = """module @jit_f {
  func.func public @main(%arg0: tensor<4xf32> {jax.arg_info = "x", mhlo.sharding = "{replicated}"})
      -> (tensor<4xf32> {jax.result_info = "[0]"}, tensor<4xf32> {jax.result_info = "[1]"}) {
    %0 = call @relu(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = call @twice(%0) : (tensor<4xf32>) -> tensor<4xf32>
    return %0, %1 : tensor<4xf32>, tensor<4xf32>
  }
  func.func private @relu(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %cst = stablehlo.constant dense<0.0> : tensor<4xf32>
    %0 = stablehlo.maximum %arg0, %cst : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @twice(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = call @relu(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.add %0, %0 : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}"""

RECURSIVE = """func.func private @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @f(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @f(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def _header(text: str) -> str:
    return next(line for line in text.splitlines() if "func.func public @main" in line or "func.func @main" in line)


@pytest.mark.fast
def test_calls_are_inlined_and_the_public_signature_kept():
    module = stablehlo.parse(CALLS, new_context())
    text = str(module)
    assert "call @" not in text and text.count("func.func") == 1
    header = _header(text)
    for attr in ('jax.arg_info = "x"', 'mhlo.sharding = "{replicated}"', 'jax.result_info = "[0]"',
                 'jax.result_info = "[1]"', "module @jit_f"):
        assert attr in header or attr in text.splitlines()[0], attr


@pytest.mark.fast
def test_a_recursive_call_is_one_error():
    with pytest.raises(CollageError, match="cannot all be inlined"):
        stablehlo.parse(RECURSIVE, new_context(), where="rec.mlir")


# --- compiled, against jax.jit -------------------------------------------------------------------


def _jax_module(f, *args, folder):
    jax = pytest.importorskip("jax")
    path = folder / "model.mlir"
    path.write_text(jax.jit(f).lower(*args).as_text())
    return path, [np.asarray(r) for r in jax.tree_util.tree_leaves(jax.jit(f)(*args))]


def _compile_and_run(path, plan: str, args, out) -> tuple[list[np.ndarray], object]:
    import collage_runtime
    from collage_mlir.iree import compile_file

    manifest = compile_file(path, output_dir=out, plan=plan, check_import=False)
    with collage_runtime.load(out, threads=1) as prog:
        return [np.array(y) for y in prog.invoke("main", *args)], manifest


def _unplaced(path, plan: str) -> set[str]:
    """The names of the ops (constants aside) ``plan`` leaves on the default backend."""
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.search import resolve_plan

    module = load_model(path, new_context())
    number_ops(module)
    graph = Graph(module)
    placed = set().union(*(r.ops for r in resolve_plan(plan, graph).regions))
    return {n.op.name for i, n in graph.nodes.items() if i not in placed and n.op.name != "stablehlo.constant"}


def _pools():
    """Max pools as JAX users write them: NHWC 3x3/2 SAME (ResNet's stem: a padded window whose -inf init
    JAX broadcasts), NHWC 2x2 VALID, a 1-D pool over (N, L, C) and one over (C, H, W) without batch."""
    import jax
    import jax.numpy as jnp

    def f(x, s, c):
        pool = lambda v, w, st, pad: jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, w, st, pad)  # noqa: E731
        return (pool(x, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), pool(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
                pool(s, (1, 3, 1), (1, 2, 1), "SAME"), pool(c, (1, 2, 2), (1, 2, 2), "VALID"))

    rng = np.random.default_rng(0)
    return f, [rng.standard_normal(s).astype(np.float32) for s in ((2, 9, 8, 5), (2, 11, 3), (3, 6, 6))]


def _chlo():
    """The CHLO ops JAX emits in models: ``chlo.square`` (``jnp.var``), ``chlo.erfc`` (exact GELU) and
    ``chlo.top_k`` (values and i32 indices), and the gather of ``take_along_axis`` on a batch of one (its
    leading dim an offset dim of the result)."""
    import jax
    import jax.numpy as jnp

    def f(x, boxes):
        values, indices = jax.lax.top_k(x, 3)
        picked = jnp.take_along_axis(boxes, indices[:1, :, None], axis=1)
        return jnp.var(x, axis=-1), jax.nn.gelu(x, approximate=False), values, indices, picked

    rng = np.random.default_rng(1)
    return f, [rng.standard_normal((4, 16)).astype(np.float32) * 3, rng.standard_normal((1, 16, 4)).astype(np.float32)]


@pytest.mark.parametrize("backend", ["ort", "openvino"])
@pytest.mark.parametrize("case", ["pools", "chlo"])
def test_jax_ops_on_one_engine_match_jax(case, backend, tmp_path):
    """Every op of the case goes to the engine (the pools: one region each, none is connected), and its
    results equal ``jax.jit``'s, dtypes included."""
    from collage_mlir.backends import get_backend

    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[backend])
    f, args = {"pools": _pools, "chlo": _chlo}[case]()
    path, want = _jax_module(f, *args, folder=tmp_path)
    got, manifest = _compile_and_run(path, f"whole:{backend}", args, tmp_path / "out")
    assert {r.backend for r in manifest.regions} == {backend} and not _unplaced(path, f"whole:{backend}")
    assert case != "pools" or len(manifest.regions) == 4
    tol = get_backend(backend).tolerance
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol.rtol, atol=tol.atol)


def _cnn():
    """A small JAX ResNet (zoo.jax_models: NHWC, jax.nn.relu as private calls, padded max pool)."""
    from collage_mlir.zoo.jax_models import resnet

    return resnet(blocks=(1, 1), base=8, classes=10, image=32)


@pytest.mark.parametrize("plan", ["prefer:openvino,ort", "whole:ort"])
def test_a_preferred_engine_takes_the_whole_jax_cnn(plan, tmp_path):
    from collage_mlir.backends import get_backend

    f, args = _cnn()
    path, want = _jax_module(f, *args, folder=tmp_path)
    got, manifest = _compile_and_run(path, plan, args, tmp_path / "out")
    engine = plan.split(":")[1].split(",")[0]
    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[engine])
    assert [r.backend for r in manifest.regions] == [engine]
    tol = get_backend(engine).tolerance
    np.testing.assert_allclose(got[0], want[0], rtol=tol.rtol, atol=tol.atol)


def test_reference_capture_of_a_jax_module_keeps_its_result_attributes(tmp_path):
    """The reference run returns inner values as extra results of ``@main``; JAX's ``jax.result_info``
    result attributes must grow with them (IREE refused the module: 'expects result attribute array to
    have the same number of elements as the number of function results')."""
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.measure.extract import ValueRef
    from collage_mlir.measure.reference import capture

    f, args = _cnn()
    path, _ = _jax_module(f, *args, folder=tmp_path)
    module = load_model(path, new_context())
    number_ops(module)
    graph = Graph(module)
    relu = next(i for i, n in graph.nodes.items() if n.op.name == "stablehlo.maximum")
    got = capture(module.operation.get_asm(binary=True), [ValueRef("main", relu, 0)], {"main": list(args)})
    value = got[ValueRef("main", relu, 0)]
    assert value.shape == (1, 16, 16, 8) and value.min() == 0.0 and value.max() > 0.0  # the stem's relu


def test_collage_tune_on_a_jax_module_compiles_and_matches_jax(tmp_path):
    """`collage tune` on a JAX CNN (NHWC, private relu calls): every plan it builds compiles (none
    crashed: outlining once killed the build of a JAX plan), and the tuned plan equals ``jax.jit``."""
    import sqlite3

    from collage_mlir.backends import get_backend
    from collage_mlir.processes import python_command

    f, args = _cnn()
    path, want = _jax_module(f, *args, folder=tmp_path)
    np.save(tmp_path / "x.npy", args[0])
    db, plan = tmp_path / "costs.sqlite", tmp_path / "plan.json"
    proc = subprocess.run(python_command("collage_mlir.tools.cli", "tune", str(path), "--backends", "iree-cpu,ort",
                                         "--budget", "30", "--jobs", "1", "--db", str(db), "--input",
                                         str(tmp_path / "x.npy"), "-o", str(plan)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with sqlite3.connect(db) as c:
        failed = c.execute("SELECT backend, status, message FROM measurements WHERE status = 'crash' "
                           "OR (backend = 'collage-plan' AND status != 'ok')").fetchall()
    assert not failed, failed
    got, _ = _compile_and_run(path, str(plan), args, tmp_path / "out")
    backends = {r["backend"] for r in json.loads(plan.read_text())["regions"]} | {"iree-cpu"}
    tol = max((get_backend(b).tolerance for b in backends), key=lambda t: t.atol)
    np.testing.assert_allclose(got[0], want[0], rtol=tol.rtol, atol=tol.atol)


# The loop and the top-k/sort model by default; every JAX zoo model's small variant with -m bench.
DEFAULT_JAX_ZOO = {"jax_lstm", "jax_detector"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_JAX_ZOO else pytest.param(n, marks=pytest.mark.bench)
                                  for n, m in zoo.MODELS.items() if m.framework is zoo.Framework.JAX])
def test_jax_zoo_small_variant_under_iree_alone_matches_jax(name, tmp_path):
    """The JAX zoo's small variants (zoo.import_stablehlo: lowered, inlined, cached) compile with IREE
    alone and equal ``jax.jit``; the output depends on the input (no saturated activations)."""
    import collage_runtime
    import jax

    from collage_mlir.iree import compile_module
    from collage_mlir.measure.validate import compare
    from collage_runtime.types import is_float

    fn, inputs = zoo.build(name, small=True)
    want = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*inputs))]
    compile_module(zoo.import_stablehlo(name, new_context(), small=True), "default", tmp_path / "out", source=name)
    with collage_runtime.load(tmp_path / "out", threads=1) as program:
        got = program.invoke("main", *zoo.numpy_inputs(name, small=True))
    check = compare(got, want, 1e-4, 0.0)
    assert check.ok, check.message
    moved = [(x + np.float32(1.0)).astype(x.dtype) if is_float(x.dtype) else np.roll(x, 1, -1) for x in inputs]  # ids shift
    other = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*moved))]
    assert compare(other, want, 1e-2, 0.0).max_rel > 0.1


def test_nhwc_cnn_onnx_keeps_no_transpose_pairs(tmp_path):
    """The ONNX of a JAX NHWC ResNet: each NCHW ``Conv`` is translated between two transposes; sunk
    through the batch norm and relu they cancel, and the batch norm folds into the convolutions (the
    op-by-op graph holds a transpose pair per convolution), computing what ``jax.jit`` does."""
    import collections

    ort = pytest.importorskip("onnxruntime")
    from collage_mlir.onnx import translate
    from collage_mlir.frontends import load_model

    f, args = _cnn()
    path, want = _jax_module(f, *args, folder=tmp_path)
    module = load_model(path, new_context())  # held: its ops die with it
    main = next(op for op in module.body.operations if str(op.attributes["sym_name"]).strip('"') == "main")
    raw, simple = translate(main, simplify=False), translate(main)
    convs = collections.Counter(n.op_type for n in raw.graph.node)["Conv"]
    ops = collections.Counter(n.op_type for n in simple.graph.node)
    assert convs >= 5 and collections.Counter(n.op_type for n in raw.graph.node)["Transpose"] >= 2 * convs
    # left: the input's and the head's transposes; the log-softmax's two subtractions
    assert ops["Conv"] == convs and ops["Transpose"] <= 2 and not {"Mul", "Div"} & set(ops) and ops["Sub"] <= 2, ops
    session = ort.InferenceSession(simple.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"in0": args[0]})[0], want[0], rtol=1e-4, atol=1e-4)


def test_bench_of_a_jax_zoo_model_against_jax_users_peers(tmp_path):
    """`collage bench` on a small JAX zoo model: the reference is ``jax.jit``, ``ort`` runs jax2onnx's
    export (the route a JAX user has to ONNX Runtime), PyTorch peers are left out, and every contender's
    outputs match ``jax.jit``'s."""
    pytest.importorskip("jax2onnx")
    from collage_mlir.tools.cli import main

    assert main(["bench", "jax_lstm", "--small", "--vs", "jax,ort,torch", "--plan", "whole:xla-cpu", "--seconds",
                 "1", "--breakdown-repeats", "0", "-o", str(tmp_path), "--name", "ci"]) == 0
    (model,) = json.loads((tmp_path / "ci.json").read_text())["models"]
    by_name = {c["name"]: c for c in model["contenders"]}
    assert list(by_name) == ["collage", "jax", "ort"]  # torch: not for a JAX model
    for c in by_name.values():
        assert c["status"] == "ok" and c["max_rel_err"] <= 1e-3 and c["median_ms"] > 0, c
    assert by_name["jax"]["max_rel_err"] == 0.0  # the reference itself


def test_scan_loops_go_whole_to_xla_and_to_the_onnx_engines():
    """A ``lax.scan`` is a ``stablehlo.while`` with its body: ``whole:xla-cpu`` places the LSTM's loops in
    one XLA region with everything else (the bench test above runs that plan against ``jax.jit``), and so
    does ``whole:openvino``, the loops as ONNX ``Loop`` nodes (test_onnx_control.py checks their numbers)."""
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.search import resolve_plan

    module = zoo.import_stablehlo("jax_lstm", new_context(), small=True)
    number_ops(module)
    graph = Graph(module)
    loops = {i for i, n in graph.nodes.items() if n.op.name == "stablehlo.while"}
    assert len(loops) == 2  # one per layer
    for engine in ("xla-cpu", "openvino"):
        plan = resolve_plan(f"whole:{engine}", graph)
        assert len(plan.regions) == 1 and loops <= plan.regions[0].ops, engine


def test_a_bf16_jax_model_runs_and_goes_whole_to_xla(tmp_path):
    """A JAX model in bf16 (weights and activations, NHWC, `jax.nn`): `collage_mlir.jax.jit` takes bf16 arrays
    and gives jax.jit's results within bf16's tolerance (it was refused: the import check compared bf16
    bit for bit, and the runtime had no bf16 dtype); whole on xla-cpu it is jax.jit's program (equal); a
    bf16 .npy (what numpy writes for ml_dtypes' bfloat16) reads back as bf16."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import ml_dtypes

    import collage_mlir.jax as cj
    import collage_runtime
    from collage_mlir.iree import compile_file
    from collage_mlir.tools import load_input_arrays

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 3, 3, 16)) * 0.3, jnp.bfloat16)
    fc = jnp.asarray(rng.standard_normal((16, 10)) * 0.3, jnp.bfloat16)

    def forward(x):
        y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.log_softmax(jax.nn.gelu(y).mean(axis=(1, 2)) @ fc)

    x = rng.standard_normal((2, 16, 16, 3)).astype(ml_dtypes.bfloat16)
    want = np.asarray(jax.jit(forward)(x)).astype(np.float32)
    got = np.asarray(cj.jit(forward)(x))
    assert got.dtype == ml_dtypes.bfloat16
    scale = np.abs(want).max()
    assert np.abs(got.astype(np.float32) - want).max() <= 5e-2 * scale  # validate.HALF_RTOL["bfloat16"]

    (tmp_path / "m.mlir").write_text(jax.export.export(jax.jit(forward))(x).mlir_module())
    manifest = compile_file(str(tmp_path / "m.mlir"), plan="whole:xla-cpu", output_dir=str(tmp_path / "xla"))
    assert [r.backend for r in manifest.regions] == ["xla-cpu"]
    np.save(tmp_path / "x.npy", x)
    (read,) = load_input_arrays([str(tmp_path / "x.npy")])
    assert read.dtype == ml_dtypes.bfloat16
    with collage_runtime.load(tmp_path / "xla") as program:
        np.testing.assert_array_equal(np.asarray(program.invoke("main", read)[0]).astype(np.float32), want)


def test_jax_compile_tunes_over_the_backends_and_precision_given(tmp_path, monkeypatch):
    """`collage_mlir.jax.compile(fn, x, tune_budget=, backends=, precision="bf16")` tunes over those backends
    and each usable bf16 one (the search replaced by a stand-in recording what it was given)."""
    jax = pytest.importorskip("jax")
    import types

    import collage_mlir.jax as cj
    from collage_mlir import entry
    from collage_mlir.backends import registry
    from collage_mlir.search.record import TunedPlan

    if registry()["openvino-bf16"].problem:
        pytest.skip(f"openvino-bf16 is not usable here: {registry()['openvino-bf16'].problem}")
    given = []

    def fake_tune(module, backends, db, work_dir, **_):
        given.append([b.name for b in backends])
        tuned = TunedPlan.from_json({"format": "collage-plan", "version": 1, "regions": []})
        return types.SimpleNamespace(plan=tuned.plan, tuned=tuned)

    monkeypatch.setattr(entry, "tune", fake_tune)
    x = np.ones((2, 8), np.float32)
    compiled = cj.compile(lambda a: jax.numpy.tanh(a) * 3.0, x, tune_budget=5, backends=["ort"], precision="bf16",
                          db=tmp_path / "c.sqlite")
    assert given == [["ort", "openvino-bf16"]] and compiled.plan_how == "tuned now"
    np.testing.assert_allclose(np.asarray(compiled(x)), np.tanh(x) * 3.0, rtol=1e-5)
