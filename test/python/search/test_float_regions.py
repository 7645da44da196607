"""Precision as a placement dimension: a plan region that dequantizes may run in float (``"precision":
"float"``: its quantize/dequantize pairs removed), the search poses each such candidate in both forms, and
the harness measures the float form as what it builds."""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir.backends import Candidate, Precision, RegionKey, get_backend
from collage_mlir.errors import CollageError
from collage_mlir.graph import Graph, number_ops, region_precision
from collage_mlir.ir import new_context, parse_module
from collage_mlir.iree import compile_module
from collage_mlir.measure.extract import extract_region
from collage_mlir.plan import Plan, Region
from collage_mlir.search.index import CandidateIndex, SearchGraph

SCALE_X, SCALE_W = 0.05, 0.002
QUANTIZED = """func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %w = stablehlo.constant dense<%W> : tensor<16x16xf32>
  %qx = stablehlo.uniform_quantize %x : (tensor<8x16xf32>) -> tensor<8x16x!quant.uniform<i8:f32, %SX:-128>>
  %dx = stablehlo.uniform_dequantize %qx : (tensor<8x16x!quant.uniform<i8:f32, %SX:-128>>) -> tensor<8x16xf32>
  %qw = stablehlo.uniform_quantize %w : (tensor<16x16xf32>) -> tensor<16x16x!quant.uniform<i8:f32, %SW>>
  %dw = stablehlo.uniform_dequantize %qw : (tensor<16x16x!quant.uniform<i8:f32, %SW>>) -> tensor<16x16xf32>
  %y = stablehlo.dot_general %dx, %dw, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %t = stablehlo.tanh %y : tensor<8x16xf32>
  return %t : tensor<8x16xf32>
}
"""
# Weights on the int8 grid (quantizing them is exact), inputs off it (quantizing them rounds) and some
# beyond what it expresses ([0, 12.75]: quantizing them saturates, as a quantizer's folded ReLU does).
W = np.random.default_rng(0).integers(-50, 50, (16, 16)) * SCALE_W
X = np.random.default_rng(1).uniform(-8, 8, (8, 16)).astype(np.float32)
#: ops: 0 constant, 1 quantize x, 2 dequantize x, 3 quantize w, 4 dequantize w, 5 dot, 6 tanh.
QUANTIZING = frozenset({1, 2, 3, 4, 5})


def _module():
    text = QUANTIZED.replace("%W", np.array2string(W.astype(np.float32), separator=",", threshold=10**6,
                                                        floatmode="unique").replace("\n", ""))
    module = parse_module(text.replace("%SX", str(SCALE_X)).replace("%SW", str(SCALE_W)), new_context())
    number_ops(module)
    return module


def _run(plan: Plan, tmp_path, name: str) -> np.ndarray:
    compile_module(_module(), plan, tmp_path / name)
    with collage_runtime.load(tmp_path / name) as program:
        return program.invoke("main", X)[0]


@pytest.mark.parametrize("backend", ["iree-cpu", "ort"])
def test_a_float_region_computes_in_float_and_the_model_precision_in_int8(backend, tmp_path):
    """The float region's result is the f32 math on the unrounded input, saturated where the quantization
    saturates (the weights' int8 values are exact); the model's precision rounds the input to its int8 grid."""
    exact = np.tanh(np.clip(X.astype(np.float64), 0, 255 * SCALE_X) @ W)
    rounded = np.tanh(np.clip(np.round(X / SCALE_X), 0, 255) * SCALE_X @ W)
    model = _run(Plan([Region("r", backend, QUANTIZING)]), tmp_path, "model")
    floated = _run(Plan([Region("r", backend, QUANTIZING, Precision.FLOAT)]), tmp_path, "float")
    np.testing.assert_allclose(floated, exact, atol=1e-5)
    np.testing.assert_allclose(model, rounded, atol=1e-5)
    assert np.abs(model - exact).max() > 1e-3  # the two precisions differ here: the test tells them apart


@pytest.mark.fast
def test_a_plan_records_each_region_precision():
    plan = Plan([Region("a", "ort", QUANTIZING, Precision.FLOAT), Region("b", "iree-cpu", frozenset({6}))])
    data = plan.to_json()
    assert data["regions"][0]["precision"] == "float" and "precision" not in data["regions"][1]
    again = Plan.from_json(data)
    assert again.key == plan.key and again.regions[0].key == RegionKey("ort", QUANTIZING, Precision.FLOAT)
    graph = Graph(_module())
    assert region_precision(graph, QUANTIZING) == "int8"
    assert region_precision(graph, QUANTIZING, Precision.FLOAT) == "f32"
    with pytest.raises(CollageError, match="the region dequantizes nothing"):
        Plan([Region("t", "iree-cpu", frozenset({6}), Precision.FLOAT)]).validate(graph)


@pytest.mark.fast
def test_the_index_poses_each_dequantizing_candidate_in_float_too():
    graph = Graph(_module())
    cut = frozenset({2, 3, 4, 5})  # x's quantized tensor would cross into it
    candidates = [Candidate("ort", "r", QUANTIZING), Candidate("ort", "t", frozenset({6})),
                  Candidate("iree-cpu", "c", cut)]
    posed = {c.key for c in CandidateIndex(SearchGraph.from_graph(graph), candidates, float_regions=True).candidates}
    assert RegionKey("ort", QUANTIZING, Precision.FLOAT) in posed and RegionKey("ort", QUANTIZING) in posed
    assert not any(k.precision is Precision.FLOAT and 6 in k.ops for k in posed)  # tanh dequantizes nothing
    # On the default backend the region is named only in float, where its edge then counts: none across it.
    assert RegionKey("iree-cpu", cut) in posed and RegionKey("iree-cpu", cut, Precision.FLOAT) not in posed
    without = CandidateIndex(SearchGraph.from_graph(graph), candidates).candidates
    assert all(c.key.precision is Precision.MODEL for c in without)


@pytest.mark.fast
def test_the_float_form_is_extracted_as_what_it_builds():
    """Its module has no quantize/dequantize left and another structural hash (the cost DB keys rows by
    it), and the plan that builds it covers exactly the ops that remain."""
    graph = Graph(_module())
    model = extract_region(graph, QUANTIZING)
    floated = extract_region(graph, QUANTIZING, Precision.FLOAT)
    assert floated.hash != model.hash and floated.precision is Precision.FLOAT
    with new_context() as ctx:
        from collage_mlir.ir import ir
        module = ir.Module.parse(floated.bytecode, ctx)
        text = str(module)
    assert "uniform_" not in text
    # The constant w, then x's clamp to the quantization's range [0, 12.75] (bounds and clamp) and the dot.
    assert text.count("stablehlo.clamp") == 1
    assert (floated.const_ops, floated.body_ops) == (1, 4)
    assert floated.plan("ort", "iree-cpu").regions[0].ops == frozenset(range(1, 5))
    assert (model.const_ops, model.body_ops) == (1, 5)
    get_backend("ort")  # the backend the plans name exists


@pytest.mark.fast
def test_the_evolution_labels_dequantizing_units_with_a_precision_too():
    """Seeds: engine a and engine b whole, at the model's precision. The float form of a's region is the
    fastest plan; the evolution finds it (a unit is (backend, precision) labelled), and only with float
    regions searched."""
    from collage_mlir.search.cost import Cost, MockEstimator
    from collage_mlir.search.evolve import EvolveOptions, evolve

    graph = SearchGraph([0, 1, 2], {0: (), 1: (0,), 2: (1,)}, {0: 64, 1: 64, 2: 64}, dequantizing=frozenset({1}))
    ops = frozenset({0, 1, 2})
    seeds = [(b, Plan([Region("region_0", b, ops)], source=b)) for b in ("a", "b")]
    times = {("a", Precision.MODEL): 2.0, ("b", Precision.MODEL): 3.0, ("a", Precision.FLOAT): 1.0,
             ("b", Precision.FLOAT): 2.5}

    class Precise(MockEstimator):
        def plan_time(self, plan, tag=""):
            self.plans_timed += 1
            if len(plan.regions) != 1 or plan.regions[0].ops != ops:
                return Cost.known(9.0, spread=0.01)
            r = plan.regions[0]
            return Cost.known(times.get((r.backend, r.precision), 9.0), spread=0.01)

    def search(float_regions: bool):
        est = Precise(0, graph.order, graph.out_bytes, producers=graph.producers)
        return evolve(graph, seeds, ["iree-cpu", "a", "b"], lambda b, o: True, est,
                      EvolveOptions(population=12, max_generations=8, patience=8), float_regions=float_regions)

    found = search(True).plan.regions
    assert [(r.backend, r.ops, r.precision) for r in found] == [("a", ops, Precision.FLOAT)]
    assert all(r.precision is Precision.MODEL for r in search(False).plan.regions)
