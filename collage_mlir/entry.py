"""What the framework entry points (``collage_mlir.torch``, ``collage_mlir.jax``) share: choosing the plan
of an imported module and compiling it into the cache.

The plan, unless the caller names one: the plan tuned before for a module of this structure on this
device (``collage tune`` and tuning entry points record it in the cost DB under the module's structural
hash), else a tune within the caller's budget, else the default plan — no tuning surprise.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collage_runtime.types import NumberFormat

from .backends import get_backend
from .errors import CollageError
from .frontends import cache_dir
from .graph import Graph, number_ops
from .ir import ir, new_context, parse_module
from .iree import compile_module
from .measure.db import CostDB, default_db_path
from .measure.device import device_fingerprint
from .measure.extract import structural_hash
from .plan import Plan
from .search import available_backends, resolve_plan, tune_backends
from .search.record import TunedPlan, TuneRecord
from .search.tune import tune

#: Search budget of ``plan="tune"`` when no ``tune_budget`` is given.
DEFAULT_TUNE_BUDGET_S = 60.0


@dataclass(frozen=True)
class PlanChoice:
    """The plan an entry point compiles, and where it came from (the artifact's provenance)."""

    plan: Plan
    how: str  # "given", "tuned before", "tuned now" or "default"
    provenance: dict


def module_key(module: ir.Module) -> str:
    """The key tuned plans are stored under: the structural hash of the numbered module."""
    number_ops(module)
    return structural_hash(module)


def record_tuned_plan(db_path: str | Path | None, key: str, tuned: TunedPlan) -> None:
    """Stores a tuned plan (``TuneResult.tuned``) under ``key`` (``module_key`` of the module before
    tuning) for this device, where ``choose_plan`` finds it."""
    with CostDB(db_path or default_db_path()) as db:
        db.put_plan(key, device_fingerprint()[0], tuned.to_json())


def choose_plan(module: ir.Module, plan: str | Plan | None = None, *, tune_budget: float | None = None,
                backends: Sequence[str] | None = None, seed: int = 0, db: str | Path | None = None,
                examples: Mapping[str, Sequence[np.ndarray]] | None = None,
                precision: str | NumberFormat | None = None) -> PlanChoice:
    """The plan for ``module`` (numbered in place): ``plan`` when given (``"tune"`` tunes now); else the
    plan tuned before (same structure, this device) from the cost DB; else a tune within ``tune_budget``
    seconds when given, over ``backends`` (default: every available one) and, with ``precision="bf16"``,
    every usable backend computing in bf16 (``collage tune --precision bf16``; None: the model's own,
    ``search.tune_backends``); else the default plan."""
    try:
        precision = None if precision is None else NumberFormat(precision)
    except ValueError:
        raise CollageError(f"precision must be 'f32' or 'bf16' (int8: quantize the model first), got {precision!r}") \
            from None
    key = module_key(module)
    graph = Graph(module)
    if plan is not None and plan != "tune":
        resolved = resolve_plan(plan, graph)
        return PlanChoice(resolved, "given", {"plan": resolved.source})
    db_path = Path(db or default_db_path())
    device = device_fingerprint()[0]
    if plan is None and db_path.is_file():  # looking up never creates a DB
        with CostDB(db_path) as cost_db:
            document = cost_db.get_plan(key, device)
        if document is not None:
            tuned = TunedPlan.from_json(document, source=f"{db_path}: tuned plan {key[:12]}")
            stored = tuned.plan
            try:
                stored.validate(graph)
            except CollageError as exc:  # e.g. a backend it used is not installed any more
                warnings.warn(f"collage: not reusing the tuned plan: {exc}", RuntimeWarning, stacklevel=3)
            else:
                return PlanChoice(stored, "tuned before", _provenance(tuned, db_path, key))
    if plan is None and not tune_budget:
        return PlanChoice(Plan(source="default"), "default", {"plan": "default"})
    chosen = tune_backends(module, [get_backend(b) for b in backends] if backends else available_backends(),
                           precision)
    budget = tune_budget or DEFAULT_TUNE_BUDGET_S
    # Tuned on a copy: the search may annotate the module it measures.
    copy = parse_module(module.operation.get_asm(binary=True), new_context())
    with CostDB(db_path) as cost_db, tempfile.TemporaryDirectory(prefix="collage-tune-") as work:
        result = tune(copy, chosen, cost_db, work, budget_s=budget, seed=seed, examples=examples)
        cost_db.put_plan(key, device, result.tuned.to_json())
    return PlanChoice(result.plan, "tuned now", _provenance(result.tuned, db_path, key))


def plan_provenance(spec: str, tuning: TuneRecord | None = None, db: str | Path | None = None) -> dict:
    """Where a plan came from, for the artifact's manifest: its spec (or file) and, for a tuned plan, the
    tuning record's seed, budget and backends (read from the plan file when not given) and the DB."""
    if tuning is None and spec.endswith(".json") and Path(spec).is_file():
        try:
            tuning = TunedPlan.from_json(json.loads(Path(spec).read_text()), source=spec).record
        except (OSError, ValueError, CollageError):  # the plan's own loading reports it
            tuning = None
    record: dict = {"plan": spec}
    if tuning is not None:
        fields = {"seed": tuning.seed, "budget_s": tuning.budget_s,
                  "backends": list(tuning.backends) if tuning.backends is not None else None}
        record |= {k: v for k, v in fields.items() if v is not None}
    if db is not None:
        record["db"] = str(db)
    return record


def _provenance(tuned: TunedPlan, db_path: Path, key: str) -> dict:
    return plan_provenance("tuned", tuned.record or TuneRecord(), db_path) | {"module_hash": key}


def artifact_key(module: ir.Module, choice: PlanChoice) -> str:
    """What a compiled artifact of ``module`` with the chosen plan is cached under: module and plan, and the
    provenance (the artifact's manifest records it)."""
    digest = hashlib.sha256(module.operation.get_asm(binary=True)).hexdigest()[:16]
    record = json.dumps([choice.plan.to_json(), choice.provenance], sort_keys=True)
    return hashlib.sha256(f"{digest}:{record}".encode()).hexdigest()[:16]


def cached_artifact(key: str) -> Path:
    """Where the compile cache keeps the artifact of ``key``."""
    return cache_dir() / "compiled" / f"{key}.collage"


def compile_cached(module: ir.Module, choice: PlanChoice, source: str) -> Path:
    """Compiles ``module`` with the chosen plan into the cache (``artifact_key``); the artifact."""
    out = cached_artifact(artifact_key(module, choice))
    if not out.exists():
        compile_module(module, choice.plan, out, source=source, provenance=choice.provenance)
    return out
