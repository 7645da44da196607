"""Tuned plans are reused by structure: a plan tuned for a model (``collage tune`` or an entry point with a
tune budget) is recorded in the cost DB under the module's structural hash, and the entry points compile
with it the next time; without one they use the default plan, or tune within the budget given. The
search itself is replaced by a stand-in here (its own tests are test_tune.py): these tests are about
recording, finding and compiling the plan."""

from __future__ import annotations

import warnings

import pytest
from models import mlp

from collage_mlir import entry
from collage_mlir.backends import get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.search.record import TunedPlan
from collage_mlir.search.simple_plans import preferred_plan


def _onednn_document(module) -> dict:
    """What `collage tune` writes: a plan with a tuning record (here: onednn for every op it takes)."""
    entry.module_key(module)  # numbers the ops the plan names
    doc = preferred_plan(Graph(module), [get_backend("onednn")]).to_json()
    doc["tuning"] = {"seed": 3, "budget_s": 5.0, "backends": ["iree-cpu", "onednn"]}
    return doc


class _FakeTune:
    """Stands in for collage_mlir.search.tune.tune: returns a fixed plan and records its calls."""

    def __init__(self, document: dict):
        self.document, self.calls = document, []

    def __call__(self, module, backends, db, work_dir, *, budget_s, seed=0, examples=None):
        from collage_mlir.search.record import TunedPlan

        self.calls.append({"budget_s": budget_s, "seed": seed, "examples": examples,
                           "backends": [b.name for b in backends]})
        tuned = TunedPlan.from_json(self.document)
        return type("Result", (), {"plan": tuned.plan, "tuned": tuned})()


def test_a_tuned_plan_is_recorded_then_reused_by_structure(torch, tmp_path, monkeypatch):
    import collage_mlir.torch
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    module = import_torch(model, [x], new_context())
    fake = _FakeTune(_onednn_document(module))
    monkeypatch.setattr(entry, "tune", fake)
    db = tmp_path / "costs.sqlite"

    # Nothing tuned yet and no budget: the default plan, no tuning, and looking up creates no DB.
    plain = collage_mlir.torch.compile(model, [x], db=db)
    assert plain.plan_how == "default" and not plain.plan.regions and not db.exists() and not fake.calls
    # A budget tunes once (on the example inputs' values) and records the plan; then it is reused.
    first = collage_mlir.torch.compile(model, [x], tune_budget=7, seed=2, db=db)
    assert first.plan_how == "tuned now" and [(c["budget_s"], c["seed"]) for c in fake.calls] == [(7, 2)]
    assert fake.calls[0]["examples"]["main"][0].shape == (4, 32)
    again = collage_mlir.torch.compile(model, [x], tune_budget=7, db=db)
    assert again.plan_how == "tuned before" and len(fake.calls) == 1
    assert again.plan.to_json() == first.plan.to_json() and {r.backend for r in again.plan.regions} == {"onednn"}
    torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-5)
    forced = collage_mlir.torch.compile(model, [x], plan="tune", db=db)  # plan="tune" tunes again
    assert forced.plan_how == "tuned now" and fake.calls[1]["budget_s"] == entry.DEFAULT_TUNE_BUDGET_S

    # What `collage tune` records (record_tuned_plan, by the structural hash of the module it imported)
    # is what the entry point finds; the artifact says where its plan came from (collage report shows it).
    provenance = again.program.manifest.provenance
    assert provenance["seed"] == 3 and provenance["budget_s"] == 5.0 and provenance["db"] == str(db)
    document = _onednn_document(module)
    document["tuning"]["seed"] = 4
    entry.record_tuned_plan(db, entry.module_key(module), TunedPlan.from_json(document))
    choice = entry.choose_plan(import_torch(model, [x], new_context()), db=db)
    assert choice.how == "tuned before" and choice.plan.to_json() == again.plan.to_json()
    assert choice.provenance["seed"] == 4


def _tuned_by_dynamo(torch, monkeypatch, options: dict) -> "_FakeTune":
    """The MLP through torch.compile(backend="collage", options=options) with the search replaced by a stand-in
    (no fallback to eager), its results checked against eager; the stand-in, with its calls."""
    model, x = mlp(), torch.randn(4, 32)
    # The graph dynamo hands over is numbered its own way: a plan without regions fits it whatever the ids.
    fake = _FakeTune({"format": "collage-plan", "version": 1, "regions": [], "tuning": {"seed": 0}})
    monkeypatch.setattr(entry, "tune", fake)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager
        y = torch.compile(model, backend="collage", options=options)(x)
    torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    return fake


def test_dynamo_options_reach_the_plan_choice(torch, tmp_path, monkeypatch):
    fake = _tuned_by_dynamo(torch, monkeypatch, {"tune_budget": 4, "db": str(tmp_path / "c.sqlite")})
    assert [c["budget_s"] for c in fake.calls] == [4]

    model, x = mlp(), torch.randn(4, 32)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="collage", options={"tune_budjet": 4})(x)
    assert [str(w.message) for w in caught if "tune_budjet" in str(w.message)], "a misspelt option is named"
    torch.testing.assert_close(y, model(x))  # and the graph ran eagerly


def test_precision_bf16_adds_the_bf16_backends_to_an_entry_points_tune(torch, tmp_path, monkeypatch):
    """`precision="bf16"` (a torch.compile option too) tunes over the backends given and each usable backend
    computing in bf16, as `collage tune --precision bf16`; another precision is one CollageError."""
    import collage_mlir.torch
    from collage_mlir.backends import registry
    from collage_mlir.errors import CollageError

    if registry()["openvino-bf16"].problem:
        pytest.skip(f"openvino-bf16 is not usable here: {registry()['openvino-bf16'].problem}")
    fake = _tuned_by_dynamo(torch, monkeypatch, {"tune_budget": 4, "backends": ["ort"], "precision": "bf16",
                                                 "db": str(tmp_path / "c.sqlite")})
    assert [c["backends"] for c in fake.calls] == [["ort", "openvino-bf16"]]
    with pytest.raises(CollageError, match="precision must be 'f32' or 'bf16'.*'int4'"):
        collage_mlir.torch.compile(mlp(), [torch.randn(4, 32)], tune_budget=4, precision="int4",
                                   db=tmp_path / "d.sqlite")


def test_a_stored_plan_that_no_longer_fits_is_not_used(torch, tmp_path):
    import collage_mlir.torch
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    module = import_torch(model, [x], new_context())
    bad = {"format": "collage-plan", "version": 1, "regions": [{"name": "r", "backend": "onednn", "ops": [999]}]}
    entry.record_tuned_plan(tmp_path / "costs.sqlite", entry.module_key(module), TunedPlan.from_json(bad))
    with pytest.warns(RuntimeWarning, match="not reusing the tuned plan.*unknown op id 999"):
        compiled = collage_mlir.torch.compile(model, [x], db=tmp_path / "costs.sqlite")
    assert compiled.plan_how == "default"
