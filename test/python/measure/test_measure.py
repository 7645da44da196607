"""The measurement harness: extraction keeps a region's semantics, failing backends become rows and
the run completes, the same region in two models is one DB row, and `collage measure` end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collage_mlir.backends import RegionKey, registry
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context, parse_module
from collage_mlir.measure.db import CostDB
from collage_mlir.measure.extract import extract_region
from collage_mlir.measure.harness import MeasureOptions, measure_regions
from collage_mlir.measure.timing import TimingOptions
from collage_mlir.measure.validate import compare
from collage_mlir.passes.number_ops import NumberOpsPass

from helpers import FAULTY, HERE, IREE_E2E
from models import ELEMENTWISE, numbered

QUICK = TimingOptions(budget_s=0.05, min_repeats=3, max_repeats=20)


def by_name(graph: Graph, name: str) -> list[int]:
    return [i for i, n in graph.nodes.items() if n.name == name]


def _blob(name: str, seed: int) -> str:
    """A resource section holding random 8x8x3x3 f32 weights, as torch-mlir writes weights."""
    data = np.random.default_rng(seed).standard_normal(8 * 8 * 3 * 3).astype("<f4").tobytes()
    return '{-#\n dialect_resources: { builtin: { %s: "0x04000000%s" } }\n#-}\n' % (name, data.hex().upper())


# -- extraction -------------------------------------------------------------------------------------

CONV_A = """
func.func @main(%x: tensor<1x8x16x16xf32>) -> tensor<1x8x16x16xf32> {
  %w = stablehlo.constant dense_resource<weight_a> : tensor<8x8x3x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x8x16x16xf32>
  %c = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x16x16xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32>
  %r = stablehlo.maximum %c, %zero : tensor<1x8x16x16xf32>
  return %r : tensor<1x8x16x16xf32>
}
""" + _blob("weight_a", 1)

# Another model with the same conv (other weights, other neighbours, other SSA names).
CONV_B = """
func.func @main(%a: tensor<1x8x16x16xf32>, %b: tensor<1x8x16x16xf32>) -> tensor<1x8x16x16xf32> {
  %in = stablehlo.add %a, %b : tensor<1x8x16x16xf32>
  %kernel = stablehlo.constant dense_resource<conv2_kernel> : tensor<8x8x3x3xf32>
  %conv = stablehlo.convolution(%in, %kernel) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x16x16xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32>
  %t = stablehlo.tanh %conv : tensor<1x8x16x16xf32>
  return %t : tensor<1x8x16x16xf32>
}
""" + _blob("conv2_kernel", 2)


@pytest.mark.fast
def test_extracted_region_takes_free_values_and_returns_escaping_ones():
    graph = Graph(numbered(ELEMENTWISE))
    add, mul = by_name(graph, "stablehlo.add")[0], by_name(graph, "stablehlo.multiply")[0]
    region = extract_region(graph, frozenset({add, mul}))
    text = str(parse_module(region.bytecode, new_context()))
    assert "func.func @main(%arg0: tensor<64xf32>, %arg1: tensor<64xf32>) -> tensor<64xf32>" in text
    assert [r.key() for r in region.inputs] == ["main:arg0", "main:arg1"]
    assert [r.key() for r in region.outputs] == [f"op{mul}:0"]
    assert "collage.id" not in text


@pytest.mark.fast
def test_structural_hash_ignores_names_and_large_weights_but_not_small_constants():
    a, b = Graph(numbered(CONV_A)), Graph(numbered(CONV_B))
    conv_a = extract_region(a, frozenset(by_name(a, "stablehlo.convolution")))
    conv_b = extract_region(b, frozenset(by_name(b, "stablehlo.convolution")))
    assert conv_a.hash == conv_b.hash
    relu = extract_region(a, frozenset(by_name(a, "stablehlo.maximum")))
    other = numbered(CONV_A.replace("dense<0.0> : tensor<1x8x16x16xf32>", "dense<1.0> : tensor<1x8x16x16xf32>"))
    g = Graph(other)
    assert extract_region(g, frozenset(by_name(g, "stablehlo.maximum"))).hash != relu.hash


CONFORMANCE = IREE_E2E
CONFORMANCE_FILES = sorted(CONFORMANCE.rglob("*.mlir")) if CONFORMANCE.is_dir() else []


def _checked_values_returned(text: str):
    """The conformance file with its ``check.*`` ops removed and the values they checked returned
    instead, so every function has results to capture."""
    from collage_mlir.graph import public_funcs
    from collage_mlir.ir import ir
    from collage_mlir.measure.reference import return_also

    module = parse_module(text, new_context())
    with module.context, ir.Location.unknown():
        for func in list(public_funcs(module)):
            block = func.regions[0].blocks[0]
            checked = []
            for op in list(block.operations):
                if op.operation.name.startswith("check."):
                    checked.append(op.operation.operands[0])
                    op.operation.erase()
            return_also(func, checked)
    NumberOpsPass().run(module)
    return module


def extraction_mismatches(path: str) -> list[str]:
    """Every single compute op and every grown region of up to 4 ops, extracted, compiled in one module
    and run on the values captured from the whole program: results must equal the in-model values.
    (Regions returning a ``tensor.empty``, whose contents are undefined, are left out.)"""
    import io

    import iree.runtime as rt

    from collage_mlir.backends.iree_codegen import iree_compile
    from collage_mlir.backends.iree_codegen import is_compute_op
    from collage_mlir.backends.patterns import grow_regions
    from collage_mlir.errors import CollageError
    from collage_mlir.ir import ir
    from collage_mlir.measure.reference import capture, model_inputs

    path = Path(path)
    module = _checked_values_returned(path.read_text())
    graph = Graph(module)
    ok = {i for i, n in graph.nodes.items() if is_compute_op(n.op) is None}
    regions = []
    for ids in [frozenset({i}) for i in sorted(ok)] + list(grow_regions(graph, ok, 4)):
        try:
            region = extract_region(graph, ids)
        except CollageError:
            continue  # a dead region: nothing to compare
        if all(graph.nodes[r.op].name != "tensor.empty" for r in region.outputs):
            regions.append(region)
    if not regions:
        return []
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    values = capture(buf.getvalue(), {r for x in regions for r in (*x.inputs, *x.outputs)}, model_inputs(module, {}))
    combined = parse_module("module {}", new_context())
    with combined.context:
        for k, region in enumerate(regions):
            part = parse_module(region.bytecode, combined.context)
            fn = part.body.operations[0]
            fn.operation.attributes["sym_name"] = ir.StringAttr.get(f"r{k}")
            combined.body.append(fn)
    vmfb = iree_compile(combined)
    ctx = rt.SystemContext(config=rt.Config("local-task"))
    vm = rt.VmModule.copy_buffer(ctx.instance, vmfb)
    ctx.add_vm_module(vm)
    fns = getattr(ctx.modules, vm.name)
    bad = []
    for k, region in enumerate(regions):
        out = fns[f"r{k}"](*[values[r] for r in region.inputs])
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        check = compare([o.to_host() for o in out], [values[r] for r in region.outputs], rtol=1e-5, atol=1e-6)
        if not check.ok:
            bad.append(f"{path.name} ops {sorted(region.ops)} ({region.summary}): {check.message}")
    return bad


#: The default suite's share of the conformance inputs (~60 s of the ~350 s the corpus takes on one core): one
#: file per kind of region content — matmuls (bf16), convolution, windows, gather/scatter, dynamic shapes and
#: slices, sort, FFT (complex), f16, and an LSTM with its reductions. The shape ops (concatenate, pad,
#: reverse, transpose, iota, select, bitcast) and the rest of the corpus: ``-m bench`` (below).
EXTRACTION_SAMPLE = ["models/unidirectional_lstm.mlir", "ops/convolution.mlir", "ops/dot_bf16.mlir",
                     "ops/dynamic_update_slice.mlir", "ops/exponential_fp16.mlir", "ops/fft.mlir", "ops/gather.mlir",
                     "ops/reduce_window.mlir", "ops/scatter_dynamic.mlir", "ops/sort.mlir", "regression/dynamic_dot.mlir"]


def _extraction_checked(files: list[Path], monkeypatch) -> list:
    """``extraction_mismatches`` of each file in two worker processes (the harness's own: a file IREE
    cannot handle costs that file only); asserts no mismatch, returns the outcomes of the files checked."""
    from concurrent.futures import ThreadPoolExecutor

    from collage_mlir.measure.worker import Worker

    # The workers import this file (and the helpers it imports) by name.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(HERE),
                                                      os.environ.get("PYTHONPATH", "")]))
    workers = [Worker(f"extract{k}") for k in range(2)]
    try:
        with ThreadPoolExecutor(len(workers)) as pool:
            outcomes = list(pool.map(lambda k: [workers[k % 2].call("test_measure:extraction_mismatches", 300,
                                                                    path=str(p)) for p in files[k::2]],
                                     range(2)))
    finally:
        for w in workers:
            w.stop()
    checked = [o for part in outcomes for o in part if o.ok]
    mismatches = [m for o in checked for m in o.value]
    assert not mismatches, "\n".join(mismatches)
    return checked


@pytest.mark.skipif(not CONFORMANCE_FILES, reason="conformance inputs not found")
def test_extraction_preserves_results_on_conformance_inputs(monkeypatch):
    """EXTRACTION_SAMPLE: every file is checked (IREE alone compiles and runs each) and no region's
    extracted results differ from the in-model values."""
    files = [CONFORMANCE / name for name in EXTRACTION_SAMPLE]
    checked = _extraction_checked(files, monkeypatch)
    assert len(checked) == len(files), f"only {len(checked)} of {len(files)} sampled files could be checked"


@pytest.mark.bench
@pytest.mark.skipif(not CONFORMANCE_FILES, reason="conformance inputs not found")
def test_extraction_preserves_results_on_every_conformance_input(monkeypatch):
    """The same check on the whole corpus (~6 minutes on 2 cores); the default suite runs it on
    EXTRACTION_SAMPLE (test_extraction_preserves_results_on_conformance_inputs)."""
    checked = _extraction_checked(CONFORMANCE_FILES, monkeypatch)
    # Files IREE alone cannot compile or run are errors here (see test/conformance/BASELINE.md).
    assert len(checked) >= 60, f"only {len(checked)} conformance files could be checked"


# -- harness ----------------------------------------------------------------------------------------


@pytest.fixture
def faulty_backends(monkeypatch):
    """Registers the faulty backends (entry points in test/python/faulty) here and in workers."""
    monkeypatch.syspath_prepend(str(FAULTY))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTY), os.environ.get("PYTHONPATH", "")]))
    registry.cache_clear()
    yield
    registry.cache_clear()


def test_faulty_backends_are_recorded_and_the_run_completes(faulty_backends, tmp_path):
    module = numbered(ELEMENTWISE)
    graph = Graph(module)
    ops = sorted(graph.nodes)
    names = ["iree-cpu", "faulty-crash", "faulty-hang", "faulty-wrong", "faulty-build"]
    adds = by_name(graph, "stablehlo.add")  # one region hash: the hang costs one timeout
    regions = [RegionKey(b, frozenset({i})) for i in ops for b in names if b != "faulty-hang" or i in adds]
    db = CostDB(tmp_path / "costs.sqlite")
    options = MeasureOptions(timing=QUICK, run_timeout_s=10, build_timeout_s=120)
    summary = measure_regions(module, regions, db, options=options)
    status = {(min(r.ops), r.backend): m for r, m in summary.rows.items()}
    assert len(status) == len(regions)
    for i in ops:
        assert status[(i, "iree-cpu")].status == "ok" and status[(i, "iree-cpu")].median_s > 0
        assert status[(i, "faulty-crash")].status == "crash"
        assert "SIGABRT" in status[(i, "faulty-crash")].message
        assert i not in adds or status[(i, "faulty-hang")].status == "timeout"
        wrong = status[(i, "faulty-wrong")]
        assert wrong.status == "wrong" and wrong.max_abs_err == pytest.approx(1.0) and wrong.median_s is None
        assert status[(i, "faulty-build")].status == "error"
        assert "cannot build anything" in status[(i, "faulty-build")].message
    # Failures are rows: a second run measures nothing again.
    again = measure_regions(module, regions, db, options=options)
    assert again.measured == 0 and again.cache_hits == len(regions)
    assert {m.status for m in db.measurements()} == {"ok", "crash", "timeout", "wrong", "error"}


def test_same_conv_in_two_models_shares_one_row(tmp_path):
    db = CostDB(tmp_path / "costs.sqlite")
    options = MeasureOptions(timing=QUICK)
    a, b = numbered(CONV_A), numbered(CONV_B)
    conv_a = frozenset(by_name(Graph(a), "stablehlo.convolution"))
    conv_b = frozenset(by_name(Graph(b), "stablehlo.convolution"))
    first = measure_regions(a, [RegionKey("iree-cpu", conv_a)], db, options=options)
    second = measure_regions(b, [RegionKey("iree-cpu", conv_b)], db, options=options)
    assert first.measured == 1 and second.cache_hits == 1 and second.measured == 0
    rows = db.measurements()
    assert len(rows) == 1 and rows[0].status == "ok" and rows[0].region == "convolution"


SHARED_SCALAR = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<1xf32>
  %r = stablehlo.reshape %c : (tensor<1xf32>) -> tensor<f32>
  %b1 = stablehlo.broadcast_in_dim %r, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %a = stablehlo.add %x, %b1 : tensor<4xf32>
  %b2 = stablehlo.broadcast_in_dim %r, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %m = stablehlo.multiply %a, %b2 : tensor<4xf32>
  return %m : tensor<4xf32>
}
"""


def test_region_handing_on_a_constant_expression_is_measured(tmp_path):
    """A region holding the reshape of a scalar constant that ops after it broadcast too returns that
    constant expression. Posed in a later batch than the first build's (when the model's values were
    captured, constants left out), its reference value is read off the IR: DCGAN's tune raised
    KeyError here."""
    module = numbered(SHARED_SCALAR)
    graph = Graph(module)
    first = frozenset(by_name(graph, "stablehlo.reshape") + by_name(graph, "stablehlo.add")
                      + by_name(graph, "stablehlo.broadcast_in_dim")[:1])
    assert len(extract_region(graph, first).outputs) == 2  # the sum and the reshaped scalar
    last = frozenset(by_name(graph, "stablehlo.multiply"))
    db = CostDB(tmp_path / "costs.sqlite")
    summary = measure_regions(module, [RegionKey("iree-cpu", last), RegionKey("iree-cpu", first)], db,
                              options=MeasureOptions(timing=QUICK, batch=1))
    assert summary.measured == 2 and [m.status for m in db.measurements()] == ["ok", "ok"]


@pytest.mark.fast
def test_validation_scales_errors_by_the_output_magnitude():
    ref = np.array([100.0, 1e-6], dtype=np.float32)
    assert compare([ref + np.float32(1e-3)], [ref], rtol=1e-4, atol=1e-5).ok
    check = compare([ref[::-1].copy()], [ref], rtol=1e-4, atol=1e-5)
    assert not check.ok and check.max_abs == pytest.approx(100.0, rel=1e-3)
    assert not compare([np.array([1, 2])], [np.array([1, 3])], rtol=1, atol=1).ok
    assert compare([np.array([np.nan, 1.0])], [np.array([np.nan, 1.0])], rtol=0, atol=0).ok


@pytest.mark.fast
def test_half_precision_outputs_are_checked_at_their_own_precision():
    """An f16 model's output 0.3 % off (a deep f16 network's roundings) passes an f32-level tolerance's
    check; 3 % off (a wrong kernel) does not."""
    ref = np.linspace(-4, 4, 64).astype(np.float16)
    assert compare([ref * np.float16(1.003)], [ref], rtol=1e-4, atol=1e-5).ok
    assert not compare([ref * np.float16(1.03)], [ref], rtol=1e-4, atol=1e-5).ok
    assert not compare([ref.astype(np.float32) * 1.003], [ref.astype(np.float32)], rtol=1e-4, atol=1e-5).ok


@pytest.mark.fast
def test_a_bf16_output_is_also_right_within_its_exact_arithmetics_slack():
    """A deep bf16 model's reference (IREE rounding at every op) is 9 % of scale from its exact arithmetic, and a
    correct engine 10 % from that reference: wrong against the reference alone, right within BF16_SLACK times the
    reference's own distance from the exact; a kernel off by O(scale) stays wrong."""
    from collage_mlir.measure.validate import BF16_SLACK

    exact = np.linspace(-4, 4, 256).astype(np.float32)
    ref = (exact + 0.36 * np.sin(np.arange(256))).astype(np.float32)      # 9 % of scale from the exact
    engine = (exact - 0.04 * np.cos(np.arange(256))).astype(np.float32)   # 1 % from the exact, 10 % from ref
    assert not compare([engine], [ref], rtol=5e-2, atol=0.0).ok
    assert compare([engine], [ref], rtol=5e-2, atol=0.0, exact=[exact]).ok
    assert BF16_SLACK * 0.09 < 1.0
    check = compare([-exact], [ref], rtol=5e-2, atol=0.0, exact=[exact])
    assert not check.ok and "exact arithmetic" in check.message
    # The reference itself near the exact: the slack is the tolerance itself.
    assert not compare([engine * 1.2], [exact], rtol=5e-2, atol=0.0, exact=[exact]).ok
    # A reference far off (IREE's bf16 of a VGG-style CNN: 0.45 of scale): the slack stops at a quarter of the scale.
    far = (exact + 1.8 * np.sin(np.arange(256))).astype(np.float32)
    assert compare([engine], [far], rtol=5e-2, atol=0.0, exact=[exact]).ok
    assert not compare([(exact + 1.4 * np.cos(np.arange(256))).astype(np.float32)], [far], rtol=5e-2, atol=0.0,
                       exact=[exact]).ok


def test_the_exact_arithmetic_of_a_bf16_model_computes_bf16_in_f32(tmp_path):
    """``invoke_alone(exact=True)``: a bf16 matmul's products and sums in f32 (as f64 math of its bf16 inputs to
    f32 precision), where IREE's own run rounds its result to bf16; the tune's checks take it as ``exact<k>``
    of a data file, which lets a run far from a coarse reference but close to the exact pass."""
    import ml_dtypes

    from collage_mlir.iree import compile_module
    from collage_mlir.measure.reference import holds_bf16, invoke_alone
    from collage_mlir.measure.tasks import time_artifact

    src = MATMUL_BF16
    module = parse_module(src, new_context())
    assert holds_bf16(module) and not holds_bf16(parse_module(ELEMENTWISE, new_context()))
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((32, 256)).astype(ml_dtypes.bfloat16) for _ in range(2))
    want = x.astype(np.float64) @ w.astype(np.float64).T
    (ref,) = invoke_alone(module, {"main": [x, w]})["main"]
    (exact,) = invoke_alone(module, {"main": [x, w]}, exact=True)["main"]
    scale = np.abs(want).max()
    assert ref.dtype == ml_dtypes.bfloat16 and exact.dtype == np.float32
    assert np.abs(exact - want).max() / scale < 1e-6 < np.abs(ref.astype(np.float64) - want).max() / scale
    # A reference 8 % of scale off (as a deep model's rounding), and the program's own results: right with the
    # exact arithmetic given, wrong without.
    compile_module(parse_module(src, new_context()), "default", tmp_path / "art")
    coarse = (exact + 0.08 * scale * np.sign(np.sin(np.arange(exact.size)).reshape(exact.shape))).astype(ml_dtypes.bfloat16)
    arrays = {"in0": x, "in1": w, "ref0": coarse}
    for name, extra in (("without", {}), ("with", {"exact0": exact})):
        np.savez(tmp_path / f"{name}.npz", **arrays, **extra)  # bf16 as |V2, read back as bf16
    assert time_artifact(str(tmp_path / "art"), str(tmp_path / "without.npz"), None, rtol=1e-4).status == "wrong"
    assert time_artifact(str(tmp_path / "art"), str(tmp_path / "with.npz"), None, rtol=1e-4).status == "ok"


#: x (32 x 256) times w (32 x 256) transposed, in bf16.
MATMUL_BF16 = """func.func @main(%x: tensor<32x256xbf16>, %w: tensor<32x256xbf16>) -> tensor<32x32xbf16> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<32x256xbf16>, tensor<32x256xbf16>) -> tensor<32x32xbf16>
  return %y : tensor<32x32xbf16>
}
"""


def test_collage_measure_cli(tmp_path):
    model = tmp_path / "model.mlir"
    model.write_text(ELEMENTWISE)
    db = tmp_path / "costs.sqlite"
    cmd = [sys.executable, "-m", "collage_mlir.tools.cli", "measure", str(model), "--backends", "iree-cpu,ort",
           "--db", str(db), "--budget", "0.05"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "iree-cpu" in proc.stdout and "cache hits" in proc.stdout and "transition cost per" in proc.stdout
    rows = CostDB(db).measurements()
    assert {m.backend for m in rows} == {"iree-cpu", "ort"} and all(m.usable for m in rows)
    # The boundary probe of every ordered pair, built and timed (the tune tests read theirs from the DB).
    probes = CostDB(db).transitions()
    assert {(t.src, t.dst) for t in probes} == {(a, b) for a in ("iree-cpu", "ort") for b in ("iree-cpu", "ort")}
    assert all(t.usable for t in probes), [(t.src, t.dst, t.status, t.message) for t in probes]
    bad = subprocess.run(cmd[:5] + ["--backends", "nosuch", "--db", str(db)], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown backend 'nosuch'" in bad.stderr and "Traceback" not in bad.stderr


def test_plans_prebuilt_side_by_side_are_timed_without_building_again(tmp_path, monkeypatch):
    """``PlanTimer.prebuild`` (a tune's seeds): the plans build at once in the pool's build workers, each
    reports its build seconds, and timing one afterwards builds nothing."""
    from collage_mlir.measure.plan_timing import PlanTimer
    from collage_mlir.measure.pool import LocalPool
    from collage_mlir.plan import Plan, Region

    module = numbered(ELEMENTWISE)
    plans = [Plan([], "iree-cpu", "iree-cpu"), Plan([Region("r", "ort", frozenset({0, 1, 2}))], "iree-cpu", "ort")]
    builds = []
    real = LocalPool.build
    monkeypatch.setattr(LocalPool, "build", lambda self, *a, **k: builds.append(1) or real(self, *a, **k))
    x = np.ones(64, np.float32)
    with PlanTimer(tmp_path, MeasureOptions(timing=QUICK, jobs=2), keep=4) as timer:
        assert not timer.holds(module, plans[0])
        seconds = timer.prebuild(module, plans)
        assert len(builds) == 2 and all(s is not None and s > 0 for s in seconds)
        # What the finalists' rounds are budgeted by: a plan held here is only timed (no build).
        assert all(timer.holds(module, p) for p in plans)
        assert not timer.holds(module, Plan([Region("r", "onednn", frozenset({0}))], "iree-cpu"))
        for plan in plans:
            outcome = timer.time(module, plan, [x, x], [np.square(x + x) + x], rtol=1e-5, atol=1e-6)
            assert outcome.ok and outcome.value.status == "ok", outcome.message
        assert len(builds) == 2, "a prebuilt plan was built again"
        assert timer.prebuild(module, plans) == [None, None]  # kept: nothing to build


def test_a_prebuild_running_at_its_deadline_is_stopped_and_left_unbuilt(tmp_path):
    """A tune's seeds: a build still running at the deadline is stopped (its worker killed: no overrun by a
    whole-model compile), not recorded as failed, and built when it is timed after all; a ``required`` plan
    (the reference) builds whatever the deadline; a plan timing's build is stopped at its ``build_by``; a
    checked call slower than ``give_up_s`` is the timing."""
    import time

    from collage_mlir.measure.plan_timing import PlanTimer
    from collage_mlir.plan import Plan, Region

    module = numbered(ELEMENTWISE)
    reference = Plan([], "iree-cpu", "iree-cpu")
    engine = Plan([Region("r", "ort", frozenset({0, 1, 2}))], "iree-cpu", "ort")
    x = np.ones(64, np.float32)
    with PlanTimer(tmp_path, MeasureOptions(timing=QUICK, jobs=2), keep=4) as timer:
        t0 = time.monotonic()
        seconds = timer.prebuild(module, [reference, engine], deadline=t0 + 0.2, required=[reference])
        assert seconds[0] is not None and seconds[1] is None, seconds
        # A search's plan timing is not built past its deadline either: None, not a failure.
        ref = [np.square(x + x) + x]
        assert timer.time(module, engine, [x, x], ref, rtol=1e-5, atol=1e-6, build_by=time.monotonic() + 0.2) is None
        outcome = timer.time(module, engine, [x, x], ref, rtol=1e-5, atol=1e-6)
        assert outcome.ok and outcome.value.status == "ok", outcome.message
        # A run that cannot end by ``run_by`` is not timed (None), and its build is kept.
        assert timer.time(module, engine, [x, x], ref, rtol=1e-5, atol=1e-6, run_by=time.monotonic() - 1) is None
        # A plan whose checked call is slower than ``give_up_s`` is timed by that call alone.
        slow = timer.time(module, engine, [x, x], ref, rtol=1e-5, atol=1e-6, give_up_s=1e-9)
        assert slow.ok and slow.value.status == "ok" and slow.value.repeats == 1, slow


@pytest.mark.fast
def test_each_backend_pair_gets_a_probe_both_sides_take():
    """cuDNN takes convolutions, not matmuls: its boundaries are probed with two 1x1 convolutions (with the
    matmul probe alone it could never be placed: the DP saw its every boundary as invalid, H100 tune);
    cuDNN and cuBLAS share no probe and are priced through the default backend."""
    from collage_mlir.backends import get_backend
    from collage_mlir.measure.transitions import Probe, probe_for, probe_module

    graphs = {p: Graph(numbered(probe_module(64, p))) for p in Probe}
    b = {n: get_backend(n) for n in ("iree-cpu", "ort", "iree-cuda", "cudnn", "cublas")}
    assert probe_for(b["iree-cpu"], b["ort"], graphs) is Probe.MATMUL
    assert probe_for(b["iree-cuda"], b["cublas"], graphs) is Probe.MATMUL
    assert probe_for(b["iree-cuda"], b["cudnn"], graphs) is probe_for(b["cudnn"], b["iree-cuda"], graphs) is Probe.CONV
    assert probe_for(b["cudnn"], b["cublas"], graphs) is None


def test_the_convolution_probe_times_a_boundary(tmp_path):
    """The 1x1-convolution probe across IREE CPU and oneDNN computes what its inputs' float64 result says."""
    from collage_mlir.backends import get_backend
    from collage_mlir.measure.plan_timing import PlanTimer
    from collage_mlir.measure.transitions import Probe, _measure_pair, _probe_inputs, probe_module

    module = numbered(probe_module(64, Probe.CONV))
    a, b = get_backend("iree-cpu"), get_backend("onednn")
    options = MeasureOptions(timing=QUICK)
    db = CostDB(tmp_path / "c.sqlite")
    alone = measure_regions(module, [RegionKey(x.name, frozenset({0})) for x in (a, b)], db, options=options).rows
    inputs, expected = _probe_inputs(64, Probe.CONV, 0)
    with PlanTimer(tmp_path / "plans", options) as timer:
        t = _measure_pair(module, a, b, ("iree-cpu", "onednn", "v", "v", "d", 0, 64 * 64 * 4), alone, timer,
                          inputs, expected, "iree-cpu")
    assert t.usable, (t.status, t.message)
