"""`collage tune`: resume after a killed tune, the same plan bytes from a warm DB (the finished tune
returned, and the search run again on the DB's rows), one-line argument
errors, and a tuned plan of a small CNN that compiles, runs and equals IREE alone."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import interruptible

from collage_mlir.search.record import TunedPlan

TINY = """func.func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %1 = stablehlo.tanh %0 : tensor<64x64xf32>
  %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %2 : tensor<64x64xf32>
}
"""


def _tune_cmd(model: Path, db: Path, out: Path) -> list[str]:
    # The budget only bounds: this tune ends long before it. A tight one (60 s) on a loaded machine cut
    # the second run short, so the third measured what it had left (not a warm run).
    return [sys.executable, "-m", "collage_mlir.tools.cli", "tune", str(model), "--backends", "iree-cpu",
            "--budget", "600", "--jobs", "1", "--db", str(db), "-o", str(out)]


def _rows(db: Path) -> dict[tuple, float]:
    if not db.exists():
        return {}
    with sqlite3.connect(db) as c:
        try:
            return {tuple(r[:2]): r[2] for r in c.execute("SELECT region_hash, backend, created FROM measurements")}
        except sqlite3.OperationalError:  # the schema is not there yet
            return {}


def test_killed_tune_resumes_and_warm_rerun_writes_the_same_plan(tmp_path):
    model, db = tmp_path / "tiny.mlir", tmp_path / "costs.sqlite"
    model.write_text(TINY)
    proc = subprocess.Popen(_tune_cmd(model, db, tmp_path / "a.json"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _rows(db) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the tune and its workers, mid-run
    proc.wait()
    before = _rows(db)
    assert before, "the tune measured nothing before it was killed"
    subprocess.run(_tune_cmd(model, db, tmp_path / "b.json"), check=True, capture_output=True)
    after = _rows(db)
    # Nothing already in the DB was measured again (a re-measured row would have a new timestamp).
    assert {k: after[k] for k in before} == before
    assert len(after) > len(before)
    warm = subprocess.run(_tune_cmd(model, db, tmp_path / "c.json"), check=True, capture_output=True, text=True)
    assert "a finished tune with these settings is in the cost DB" in warm.stdout  # returned, not searched
    # The search itself from the warm DB: every answer from it, the same plan.
    subprocess.run([*_tune_cmd(model, db, tmp_path / "d.json"), "--search-again"], check=True, capture_output=True)
    assert _rows(db) == after
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "c.json").read_bytes() == (tmp_path / "d.json").read_bytes()
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["format"] == "collage-plan" and doc["tuning"]["single_backend"]["iree-cpu"]["measured_s"] > 0
    tuned = TunedPlan.from_json(doc)  # the typed value reads back the bytes written
    assert tuned.to_json() == doc and json.dumps(tuned.to_json(), indent=1) + "\n" == (tmp_path / "c.json").read_text()
    assert tuned.record.single_backend["iree-cpu"].measured_s > 0 and len(tuned.choices) == len(tuned.plan.regions)
    page = (tmp_path / "c.html").read_text()  # the report beside the plan
    assert "<svg" in page and "iree-cpu alone" in page
    # Recorded by structure, for the entry points to reuse (test_tuned_plans.py).
    from collage_mlir.entry import choose_plan
    from collage_mlir.ir import new_context, parse_module

    assert choose_plan(parse_module(TINY, new_context()), db=db).how == "tuned before"


@pytest.mark.serial
def test_ctrl_c_returns_the_fastest_plan_timed_so_far_and_a_rerun_goes_on(tmp_path):
    """SIGINT to the tune's process group once its first plan is timed: exit 130, the plan file holds the
    fastest plan timed by then (said in its record), nothing is kept as a finished tune, and the same command
    again finishes the search from the rows measured."""
    model, db = tmp_path / "tiny.mlir", tmp_path / "costs.sqlite"
    model.write_text(TINY)
    cmd = [*_tune_cmd(model, db, tmp_path / "a.json")[:-8], "--backends", "iree-cpu,ort", "--budget", "30",
           "--db", str(db), "-o", str(tmp_path / "a.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not _rows(db) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the tune ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: wrote" in out and "Traceback" not in err, (out, err)
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["default_backend"] == "iree-cpu" and doc["tuning"]["why"].startswith("interrupted after")
    assert doc["tuning"]["plan"]["measured_s"] > 0
    before = _rows(db)
    done = subprocess.run(cmd[:-1] + [str(tmp_path / "b.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "a finished tune" not in done.stdout  # the interrupted run kept no result: this one searched
    after = _rows(db)
    assert {k: after[k] for k in before} == before  # nothing measured again
    assert not json.loads((tmp_path / "b.json").read_text())["tuning"]["why"].startswith("interrupted")


@pytest.mark.fast
def test_a_tuned_plan_document_round_trips():
    """TunedPlan.from_json(doc).to_json() == doc, key order included, for a document as `collage tune`
    writes it; a plain plan reads with no choices and no record, a partial record as written."""
    doc = {"format": "collage-plan", "version": 1, "default_backend": "iree-cpu",
           "regions": [{"name": "r0", "backend": "onednn", "ops": [1, 2], "cost_s": 1e-4, "runner_up": "iree-cpu",
                        "runner_up_cost_s": 2e-4, "why": "cheapest measured region (iree-cpu next, 2.00x)"},
                       {"name": "r1", "backend": "ort", "ops": [4], "cost_s": None, "runner_up": None,
                        "runner_up_cost_s": None, "why": "not measured alone within the budget"}],
           "tuning": {"seed": 0, "budget_s": 60.0, "backends": ["iree-cpu", "onednn", "ort"], "candidates": 7,
                      "generations": 2, "plans_timed": 5, "why": "dp plan beat the best single backend",
                      "plan": {"predicted_s": 3e-4, "measured_s": 3.1e-4, "spread": 0.02, "from": "dp"},
                      "dp": {"predicted_s": 3e-4, "measured_s": None, "regions": 2},
                      "single_backend": {"iree-cpu": {"predicted_s": None, "measured_s": 5e-4, "regions": 0}},
                      "finalists": [{"from": "dp", "regions": 2, "times_s": [3e-4, 3.1e-4, 3.2e-4], "spread": 0.02}],
                      "untimed": ["ort"]}}
    tuned = TunedPlan.from_json(doc)
    assert json.dumps(tuned.to_json(), indent=1) == json.dumps(doc, indent=1)
    assert tuned.choices[1].cost_s is None and tuned.record.finalists[0].source == "dp"
    assert tuned.record.untimed == ("ort",)
    plain = {k: doc[k] for k in ("format", "version", "default_backend")} | {
        "regions": [{k: r[k] for k in ("name", "backend", "ops")} for r in doc["regions"]]}
    assert TunedPlan.from_json(plain).record is None and TunedPlan.from_json(plain).to_json() == plain
    partial = plain | {"tuning": {"seed": 3, "budget_s": 5.0, "backends": ["iree-cpu"]}}
    assert TunedPlan.from_json(partial).to_json() == partial


def test_a_whole_model_seed_prices_its_region_for_the_dp(tmp_path):
    """ORT takes the tiny model whole: its seed, one region over every op, timed whole, is that region's
    cost. The regions stage does not build the region again alone, and the DP can take it, so its plan
    is priced no higher than that seed. The boundary probes are in the DB already, as a rerun on this
    machine finds them (built, they were half this test's time; test_collage_measure_cli builds them);
    the evolution has the seeds alone to breed (its plans' builds were most of what was left)."""
    from collage_mlir.backends import get_backend
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.measure import HARNESS_VERSION
    from collage_mlir.measure.db import CostDB, Transition
    from collage_mlir.measure.device import device_fingerprint
    from collage_mlir.search.evolve import EvolveOptions
    from collage_mlir.search.measured import PROBE_SIZES
    from collage_mlir.search.tune import tune

    db = tmp_path / "costs.sqlite"
    device, _ = device_fingerprint()
    with CostDB(db) as d:
        for a, b in [("iree-cpu", "ort"), ("ort", "iree-cpu"), ("ort", "ort")]:
            for n in PROBE_SIZES:  # a plausible line: 20 µs + 0.1 ns per byte
                d.put_transition(Transition(a, b, get_backend(a).version(), get_backend(b).version(), device,
                                            HARNESS_VERSION, n * n * 4, "ok", 20e-6 + 1e-10 * n * n * 4))
        result = tune(parse_module(TINY, new_context()), [get_backend("iree-cpu"), get_backend("ort")], d,
                      tmp_path / "work", budget_s=600, evolve_options=EvolveOptions(population=1))
    tuning = result.tuned.to_json()["tuning"]
    # Priced (by the seed's timing; the record's measured_s is the finalist rounds' median) and no
    # cheaper for the DP than its own optimum.
    whole = tuning["single_backend"]["ort"]
    assert whole["predicted_s"] is not None and tuning["dp"]["predicted_s"] <= whole["predicted_s"]
    assert "untimed" not in tuning  # every seed was timed
    with sqlite3.connect(db) as c:
        ort_regions = [r for (r,) in c.execute("SELECT region FROM measurements WHERE backend = 'ort'")]
        profiled = c.execute("SELECT count(*) FROM derived WHERE kind = 'in-context'").fetchone()[0]
    # Smaller ones were priced in context from ORT's profile of its seed (test_in_context.py), not built.
    assert profiled == 1 and "dot_general, tanh, dot_general" not in ort_regions


def test_seeds_the_budget_did_not_reach_are_named(tmp_path, capsys):
    """A budget shorter than a whole-model build: the default seed (the fallback) is built and timed,
    ORT's is not, and the record and the summary say so (a 40 s tune of a full ResNet-50 on an H200
    timed IREE alone only, and said it was the fastest finalist as if the kernels had lost)."""
    from collage_mlir.backends import get_backend
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.measure.db import CostDB
    from collage_mlir.search.tune import tune
    from collage_mlir.tools.tune_cmd import print_summary

    with CostDB(tmp_path / "costs.sqlite") as d:
        result = tune(parse_module(TINY, new_context()), [get_backend("iree-cpu"), get_backend("ort")], d,
                      tmp_path / "work", budget_s=0.05)
        rec = result.tuned.record
        assert rec.untimed == ("ort",) and set(rec.single_backend) == {"iree-cpu"}
        assert result.plan.regions == () or all(r.backend == "iree-cpu" for r in result.plan.regions)
        print_summary(result, "plan.json")
    out = " ".join(capsys.readouterr().out.split())
    assert "not timed within the 0.05 s budget: ort alone" in out and "a longer --budget times them" in out


@pytest.mark.fast
@pytest.mark.parametrize("args, message", [
    (["--budget", "-1"], "--budget: budget must be a positive duration"),
    (["--budget", "10x"], "--budget: budget must be a positive duration"),
    (["--backends", ""], "--backends: no backend named"),
    (["--backends", "iree-cpu,nope"], "--backends: unknown backend 'nope'"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, args, message):
    from collage_mlir.tools.cli import main

    model = tmp_path / "tiny.mlir"
    model.write_text(TINY)
    assert main(["tune", str(model), *args, "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "p.json").exists()


def test_tuned_cnn_plan_compiles_and_matches_iree_alone(tmp_path):
    """The two-level search on the small CNN's real graph and backend rules, with mock costs (the
    compiler is the point here, not the timings): the plan it picks compiles, runs and equals IREE alone."""
    import collage_runtime
    import torch

    from collage_mlir.backends import get_backend
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.graph import Graph
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context
    from collage_mlir.passes.number_ops import NumberOpsPass
    from collage_mlir.search.cost import MockEstimator
    from collage_mlir.search.dp import optimize
    from collage_mlir.search.evolve import EvolveOptions, evolve
    from collage_mlir.search.index import CandidateIndex
    from collage_mlir.search.simple_plans import single_backend_plans
    from collage_mlir.search.tune import accepts_fn

    from models import small_cnn

    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    module = import_torch(small_cnn(), [x], new_context())
    NumberOpsPass().run(module)
    graph = Graph(module)
    backends = [get_backend(n) for n in ("iree-cpu", "onednn")]
    index = CandidateIndex.build(graph, backends)
    sg = index.graph
    est = MockEstimator(3, sg.order, sg.out_bytes, producers=sg.producers, invalid_rate=0.0, nonadditive=0.3)
    dp = optimize(index, est)
    seeds = [*single_backend_plans(graph, backends).items(), ("dp", dp.plan)]
    result = evolve(sg, seeds, ["iree-cpu", "onednn"], accepts_fn(graph, "iree-cpu"), est, EvolveOptions(seed=1, population=12,
                                                                                             max_generations=4))
    result.plan.validate(graph)
    assert any(r.backend == "onednn" for r in result.plan.regions), "mock costs favour onednn convs"
    tuned = compile_module(module, result.plan, tmp_path / "tuned")
    alone = compile_module(import_torch(small_cnn(), [x], new_context()), "default", tmp_path / "alone")
    with collage_runtime.load(tuned.out_dir) as p:
        (y,) = p.invoke("main", x.numpy())
    with collage_runtime.load(alone.out_dir) as p:
        (ref,) = p.invoke("main", x.numpy())
    tol = get_backend("onednn").tolerance
    np.testing.assert_allclose(y, ref, rtol=tol.rtol, atol=tol.atol)


def test_a_quantized_model_tunes_with_its_quantized_chains_whole(tmp_path):
    """A model with quantize/dequantize pairs: no region the search measures takes or gives a quantized
    tensor (a quantize alone on IREE is priced only with its neighbours), every seed is timed and
    validated (ORT's in float too), and the plan keeps each pair inside one region."""
    from collage_mlir.backends import get_backend
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.measure import HARNESS_VERSION
    from collage_mlir.measure.db import CostDB, Transition
    from collage_mlir.measure.device import device_fingerprint
    from collage_mlir.search.evolve import EvolveOptions
    from collage_mlir.search.measured import PROBE_SIZES
    from collage_mlir.search.tune import tune

    quantized = """func.func @main(%x: tensor<32x32xf32>) -> tensor<32x32xf32> {
  %w = stablehlo.constant dense<0.25> : tensor<32x32xf32>
  %qx = stablehlo.uniform_quantize %x : (tensor<32x32xf32>) -> tensor<32x32x!quant.uniform<i8:f32, 0.05:3>>
  %dx = stablehlo.uniform_dequantize %qx : (tensor<32x32x!quant.uniform<i8:f32, 0.05:3>>) -> tensor<32x32xf32>
  %qw = stablehlo.uniform_quantize %w : (tensor<32x32xf32>) -> tensor<32x32x!quant.uniform<i8:f32:1, {%s}>>
  %dw = stablehlo.uniform_dequantize %qw : (tensor<32x32x!quant.uniform<i8:f32:1, {%s}>>) -> tensor<32x32xf32>
  %y = stablehlo.dot_general %dx, %dw, contracting_dims = [1] x [0] : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %t = stablehlo.tanh %y : tensor<32x32xf32>
  return %t : tensor<32x32xf32>
}
""".replace("%s", ",".join(["0.01"] * 32))
    db = tmp_path / "costs.sqlite"
    device, _ = device_fingerprint()
    with CostDB(db) as d:
        for a, b in [("iree-cpu", "ort"), ("ort", "iree-cpu"), ("ort", "ort")]:
            for n in PROBE_SIZES:
                d.put_transition(Transition(a, b, get_backend(a).version(), get_backend(b).version(), device,
                                            HARNESS_VERSION, n * n * 4, "ok", 20e-6 + 1e-10 * n * n * 4))
        module = parse_module(quantized, new_context())
        result = tune(module, [get_backend("iree-cpu"), get_backend("ort")], d, tmp_path / "work", budget_s=600,
                      evolve_options=EvolveOptions(population=1))
    tuning = result.tuned.to_json()["tuning"]
    assert tuning["single_backend"]["ort"]["predicted_s"] is not None  # timed and validated whole
    # ORT on the model in float (its pairs removed) is a seed too, built, timed and validated beside it.
    assert tuning["single_backend"]["ort:float"]["measured_s"] is not None
    numbered = parse_module(quantized, new_context())
    number_ops(numbered)
    result.tuned.plan.validate(Graph(numbered))
    with sqlite3.connect(db) as c:
        statuses = {s for (s,) in c.execute("SELECT status FROM measurements")}
    assert statuses <= {"ok"}, [r for r in sqlite3.connect(db).execute("SELECT backend, region, status, message FROM measurements WHERE status != 'ok'")]
