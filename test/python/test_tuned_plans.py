"""Tuned plans are reused by structure: a plan tuned for a model (``collage tune`` or an entry point with a
tune budget) is recorded in the cost DB under the module's structural hash, and the entry points compile
with it the next time; without one they use the default plan, or tune within the budget given. The
search itself is replaced by a stand-in here (its own tests are test_tune.py): these tests are about
recording, finding and compiling the plan."""

from __future__ import annotations

import json
import warnings
import zipfile

import pytest
from models import mlp

from collage_mlir import entry
from collage_mlir.backends import get_backend
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.search.simple_plans import preferred_plan


def _onednn_document(module) -> dict:
    """What `collage tune` writes: a plan with a tuning record (here: onednn for every op it takes)."""
    doc = preferred_plan(Graph(module), [get_backend("onednn")]).to_json()
    doc["tuning"] = {"seed": 3, "budget_s": 5.0, "backends": ["iree-cpu", "onednn"]}
    return doc


class _FakeTune:
    """Stands in for collage_mlir.search.tune.tune: returns a fixed plan and records its calls."""

    def __init__(self, document: dict):
        self.document, self.calls = document, []

    def __call__(self, module, backends, db, work_dir, *, budget_s, seed=0, examples=None):
        from collage_mlir.plan import Plan

        self.calls.append({"budget_s": budget_s, "seed": seed, "examples": examples})
        return type("Result", (), {"plan": Plan.from_json(self.document), "document": self.document})()


def _manifest(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("manifest.json"))


def test_a_model_tuned_before_compiles_with_its_plan(torch, tmp_path):
    import collage_mlir.torch
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    module = import_torch(model, [x], new_context())
    key = entry.module_key(module)
    entry.record_tuned_plan(tmp_path / "costs.sqlite", key, _onednn_document(module))  # as `collage tune` does

    compiled = collage_mlir.torch.compile(model, [x], db=tmp_path / "costs.sqlite")
    assert compiled.plan_how == "tuned before"
    assert {r.backend for r in compiled.plan.regions} == {"onednn"}
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # Another model structure, or another DB, finds nothing: the default plan, no tuning.
    other = collage_mlir.torch.compile(model, [x], db=tmp_path / "empty.sqlite")
    assert other.plan_how == "default" and not other.plan.regions
    assert not (tmp_path / "empty.sqlite").exists()  # looking up creates no DB


def test_tune_budget_tunes_once_then_the_plan_is_reused(torch, tmp_path, monkeypatch):
    import collage_mlir.torch
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    fake = _FakeTune(_onednn_document(import_torch(model, [x], new_context())))
    monkeypatch.setattr(entry, "tune", fake)
    db = tmp_path / "costs.sqlite"

    first = collage_mlir.torch.compile(model, [x], tune_budget=7, seed=2, db=db)
    assert first.plan_how == "tuned now" and fake.calls[0]["budget_s"] == 7 and fake.calls[0]["seed"] == 2
    assert fake.calls[0]["examples"]["main"][0].shape == (4, 32)  # tuned on the example inputs' values
    again = collage_mlir.torch.compile(model, [x], tune_budget=7, db=db)
    assert again.plan_how == "tuned before" and len(fake.calls) == 1
    assert again.plan.to_json() == first.plan.to_json()
    forced = collage_mlir.torch.compile(model, [x], plan="tune", db=db)  # plan="tune" tunes again
    assert forced.plan_how == "tuned now" and fake.calls[1]["budget_s"] == entry.DEFAULT_TUNE_BUDGET_S

    # The artifact records where its plan came from (collage report shows it).
    artifact = entry.compile_cached(import_torch(model, [x], new_context()),
                                    entry.choose_plan(import_torch(model, [x], new_context()), db=db), "t")
    provenance = _manifest(artifact)["provenance"]
    assert provenance["seed"] == 3 and provenance["budget_s"] == 5.0 and provenance["db"] == str(db)


def test_dynamo_options_reach_the_plan_choice(torch, tmp_path, monkeypatch):
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    fake = _FakeTune(_onednn_document(import_torch(model, [x], new_context())))
    monkeypatch.setattr(entry, "tune", fake)
    torch._dynamo.reset()
    y = torch.compile(model, backend="collage", options={"tune_budget": 4, "db": str(tmp_path / "c.sqlite")})(x)
    torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    assert [c["budget_s"] for c in fake.calls] == [4]

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="collage", options={"tune_budjet": 4})(x)
    assert [str(w.message) for w in caught if "tune_budjet" in str(w.message)], "a misspelt option is named"
    torch.testing.assert_close(y, model(x))  # and the graph ran eagerly


def test_a_stored_plan_that_no_longer_fits_is_not_used(torch, tmp_path):
    import collage_mlir.torch
    from collage_mlir.frontends.torch import import_torch

    model, x = mlp(), torch.randn(4, 32)
    module = import_torch(model, [x], new_context())
    bad = {"format": "collage-plan", "version": 1, "regions": [{"name": "r", "backend": "onednn", "ops": [999]}]}
    entry.record_tuned_plan(tmp_path / "costs.sqlite", entry.module_key(module), bad)
    with pytest.warns(RuntimeWarning, match="not reusing the tuned plan.*unknown op id 999"):
        compiled = collage_mlir.torch.compile(model, [x], db=tmp_path / "costs.sqlite")
    assert compiled.plan_how == "default"
