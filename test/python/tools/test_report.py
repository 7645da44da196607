"""`collage report`: one self-contained HTML page (checked here with an HTML parser, which CI has; in a real
headless chromium by test_report_browser.py, marked bench) with the graph drawn, each region's backend,
ops and the costs the DB holds for it, and an artifact's run broken down."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser

from collage_mlir.graph import Graph
from collage_mlir.ir import new_context, parse_module
from collage_mlir.measure import HARNESS_VERSION
from collage_mlir.measure.db import CostDB, Measurement
from collage_mlir.measure.device import device_fingerprint
from collage_mlir.measure.extract import extract_region
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.tools import cli

from helpers import LIT_INPUTS



class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.cells: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.external += [v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#")]

    def handle_data(self, data):
        if data.strip():
            self.cells.append(data.strip())


def _report(plan, model, tmp_path) -> subprocess.CompletedProcess:
    """``collage report PLAN --model MODEL`` with the DB and page in ``tmp_path``."""
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "report", str(plan), "--model", str(model),
                           "--db", str(tmp_path / "costs.sqlite"), "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True)


def test_report_of_a_plan_with_db_costs(tmp_path):
    model = LIT_INPUTS / "mlp.mlir"
    module = parse_module(model.read_text(), new_context())
    NumberOpsPass().run(module)
    region_hash = extract_region(Graph(module), frozenset({1, 2, 3, 4})).hash
    with CostDB(tmp_path / "costs.sqlite") as db:
        for backend, median in (("onednn", 12e-6), ("ort", 30e-6)):
            db.put(Measurement(region_hash, backend, "v", device_fingerprint()[0], HARNESS_VERSION, "ok",
                               median_s=median, min_s=median))
    r = _report(LIT_INPUTS / "mlp-plan.json", model, tmp_path)
    assert r.returncode == 0, r.stderr
    page = _Page()
    page.feed((tmp_path / "r.html").read_text())
    assert page.tags.get("svg") == 1 and "script" not in page.tags and not page.external  # self-contained
    cells = page.cells
    assert "layer1" in cells and "onednn" in cells and "act" in cells
    assert "1 stablehlo.dot_general, 2 stablehlo.broadcast_in_dim, 3 stablehlo.add, 4 stablehlo.maximum" in cells
    assert "12.0 µs" in cells and "30.0 µs" in cells  # the DB's costs of region layer1 on each backend


def test_report_errors_are_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "report", str(tmp_path / "nope"), "-o",
                        str(tmp_path / "r.html")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr


def _rows(page: _Page, first: str) -> dict[str, str]:
    """Table rows after the cell ``first`` as {label: the next cell}."""
    cells = page.cells[page.cells.index(first):]
    return {cells[k]: cells[k + 1] for k in range(len(cells) - 1)}


def test_report_of_an_artifact_breaks_a_run_down_and_states_provenance(tmp_path):
    plan = json.loads((LIT_INPUTS / "mlp-plan.json").read_text())
    plan["tuning"] = {"seed": 3, "budget_s": 5.0, "backends": ["iree-cpu", "onednn"]}  # as `collage tune` writes
    (tmp_path / "tuned.json").write_text(json.dumps(plan))
    # In this process (two fewer interpreter starts): the CLI's compile, then its report.
    assert cli.main(["compile", str(LIT_INPUTS / "mlp.mlir"), "--plan", str(tmp_path / "tuned.json"),
                     "-o", str(tmp_path / "mlp.collage")]) == 0
    assert cli.main(["report", str(tmp_path / "mlp.collage"), "--db", str(tmp_path / "none.sqlite"),
                     "--repeats", "5", "-o", str(tmp_path / "r.html")]) == 0
    page = _Page()
    page.feed((tmp_path / "r.html").read_text())
    assert "End-to-end breakdown" in page.cells and page.tags.get("svg") == 1  # graph from the recorded source

    def ms(text: str) -> float:
        assert text.endswith(" ms"), text
        return float(text.removesuffix(" ms"))

    rows = _rows(page, "End-to-end breakdown")
    region = ms(rows["region layer1 (onednn)"])  # the one library region, timed by the runtime's hook
    boundary = ms(rows["boundary of layer1 (collage_rt call less the engine)"])
    outside = next(ms(v) for k, v in rows.items() if k.startswith("outside library regions"))
    total = ms(rows["end to end"])
    assert region > 0 and boundary >= 0 and outside > 0
    assert abs(region + boundary + outside - total) < 0.0015  # the parts add up (3-decimal rounding)
    prov = _rows(page, "Provenance")
    assert prov["tuning seed"] == "3" and prov["tuning budget (s)"] == "5.0"
    assert prov["tuning backends"] == "iree-cpu, onednn" and prov["plan"].endswith("tuned.json")
    assert prov["version collage-mlir"] and prov["artifact source"].endswith("mlp.mlir")


def test_report_states_each_regions_precision(tmp_path):
    """A region whose matmul reads dequantized int8 values is int8; an f32 one is f32."""
    from collage_mlir.graph import number_ops, region_precision
    from collage_mlir.plan import Plan, Region

    text = """func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %q = stablehlo.uniform_quantize %x : (tensor<4x8xf32>) -> tensor<4x8x!quant.uniform<i8:f32, 0.05:3>>
  %d = stablehlo.uniform_dequantize %q : (tensor<4x8x!quant.uniform<i8:f32, 0.05:3>>) -> tensor<4x8xf32>
  %y = stablehlo.dot_general %d, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = stablehlo.dot_general %y, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}"""
    module = parse_module(text, new_context())
    number_ops(module)
    graph = Graph(module)
    assert [region_precision(graph, {i}) for i in sorted(graph.nodes)] == ["-", "-", "int8", "f32"]
    model = tmp_path / "q.mlir"
    model.write_text(text)
    Plan([Region("q", "ort", frozenset({0, 1, 2})), Region("f", "ort", frozenset({3}))]).save(tmp_path / "plan.json")
    r = _report(tmp_path / "plan.json", model, tmp_path)
    assert r.returncode == 0, r.stderr
    page = _Page()
    page.feed((tmp_path / "r.html").read_text())
    assert page.cells[page.cells.index("q") + 2] == "int8" and page.cells[page.cells.index("f") + 2] == "f32"
