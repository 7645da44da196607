"""The tuned plan document as typed values: what ``collage tune`` writes (the plan JSON, readable by
``Plan.from_json``, with per region its cost, runner-up and why, and a ``"tuning"`` record of the
search). ``TunedPlan.to_json`` gives the document's JSON (same keys, same order as ever), ``from_json``
reads it back; a plain plan file reads as a ``TunedPlan`` with no choices and no record.

    {"format": "collage-plan", "version": 1, "default_backend": "iree-cpu",
     "regions": [{"name": "r0", "backend": "onednn", "ops": [3, 4],
                  "cost_s": 1e-4, "runner_up": "iree-cpu", "runner_up_cost_s": 2e-4, "why": "..."}],
     "tuning": {"seed": 0, "budget_s": 60.0, "backends": [...], "candidates": 12, "generations": 3,
                "plans_timed": 9, "why": "...",
                "plan": {"predicted_s": ..., "measured_s": ..., "spread": ..., "from": "dp"},
                "dp": {"predicted_s": ..., "measured_s": ..., "regions": 2},
                "single_backend": {"onednn": {"predicted_s": ..., "measured_s": ..., "regions": 1}},
                "finalists": [{"from": "dp", "regions": 2, "times_s": [...], "spread": ...}]}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CollageError
from ..plan import Plan

#: The per-region keys a tuned plan adds to the plan's region entries, in the document's order.
_CHOICE_KEYS = ("cost_s", "runner_up", "runner_up_cost_s", "why")


def _bad(msg: str, source: str) -> CollageError:
    return CollageError(f"tuning record: {msg}", where=source)


def _dict(data: object, what: str, source: str) -> dict:
    if not isinstance(data, dict):
        raise _bad(f"{what} must be an object", source)
    return data


@dataclass(frozen=True)
class RegionChoice:
    """Why a region of the tuned plan has its backend: its measured cost alone (None when not measured
    alone within the budget), the cheapest other backend and its cost, and the reason in words."""

    cost_s: float | None
    runner_up: str | None
    runner_up_cost_s: float | None
    why: str

    def to_json(self) -> dict:
        return {"cost_s": self.cost_s, "runner_up": self.runner_up, "runner_up_cost_s": self.runner_up_cost_s,
                "why": self.why}

    @classmethod
    def from_json(cls, data: dict) -> "RegionChoice":
        return cls(data.get("cost_s"), data.get("runner_up"), data.get("runner_up_cost_s"), data.get("why", ""))


@dataclass(frozen=True)
class PlanTimes:
    """A plan's end-to-end time as the DP's costs predict it and as measured (None: not known), and its
    region count."""

    predicted_s: float | None
    measured_s: float | None
    regions: int

    def to_json(self) -> dict:
        return {"predicted_s": self.predicted_s, "measured_s": self.measured_s, "regions": self.regions}

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "PlanTimes":
        d = _dict(data, "plan times", source)
        return cls(d.get("predicted_s"), d.get("measured_s"), d.get("regions"))


@dataclass(frozen=True)
class ChosenTimes:
    """The chosen plan's times: predicted, measured (the finalists' median), the rounds' spread, and the
    seed or generation it came from."""

    predicted_s: float | None
    measured_s: float | None
    spread: float | None
    source: str | None  # "from" in the JSON

    def to_json(self) -> dict:
        return {"predicted_s": self.predicted_s, "measured_s": self.measured_s, "spread": self.spread,
                "from": self.source}

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "ChosenTimes":
        d = _dict(data, "\"plan\"", source)
        return cls(d.get("predicted_s"), d.get("measured_s"), d.get("spread"), d.get("from"))


@dataclass(frozen=True)
class Finalist:
    """A plan re-measured side by side at the end: where it came from, its region count, its rounds'
    times and their spread."""

    source: str  # "from" in the JSON
    regions: int
    times_s: tuple[float, ...]
    spread: float | None

    def to_json(self) -> dict:
        return {"from": self.source, "regions": self.regions, "times_s": list(self.times_s), "spread": self.spread}

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "Finalist":
        d = _dict(data, "a finalist", source)
        return cls(d.get("from"), d.get("regions"), tuple(d.get("times_s") or ()), d.get("spread"))


@dataclass(frozen=True)
class TuneRecord:
    """The ``"tuning"`` object: the search's settings and outcome. A partial record (e.g. one written by
    hand with only seed, budget and backends) reads with the rest None; None fields are not written."""

    seed: int | None = None
    budget_s: float | None = None
    backends: tuple[str, ...] | None = None
    candidates: int | None = None
    generations: int | None = None
    plans_timed: int | None = None
    why: str | None = None
    plan: ChosenTimes | None = None
    dp: PlanTimes | None = None
    single_backend: dict[str, PlanTimes] | None = None
    finalists: tuple[Finalist, ...] | None = None
    #: Backends whose whole-model plan (seed) this tune neither timed nor found in the DB: their builds did
    #: not end within the budget, so the plan was chosen without them (a 40 s tune of a full ResNet-50 on
    #: an H200 timed IREE alone only: each whole-model build there took 30-50 s).
    untimed: tuple[str, ...] | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "seed": self.seed,
            "budget_s": self.budget_s,
            "backends": list(self.backends) if self.backends is not None else None,
            "candidates": self.candidates,
            "generations": self.generations,
            "plans_timed": self.plans_timed,
            "why": self.why,
            "plan": self.plan.to_json() if self.plan is not None else None,
            "dp": self.dp.to_json() if self.dp is not None else None,
            "single_backend": ({n: t.to_json() for n, t in self.single_backend.items()}
                               if self.single_backend is not None else None),
            "finalists": [f.to_json() for f in self.finalists] if self.finalists is not None else None,
            "untimed": list(self.untimed) if self.untimed else None,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "TuneRecord":
        d = _dict(data, "\"tuning\"", source)
        backends = d.get("backends")
        if backends is not None and not (isinstance(backends, list) and all(isinstance(b, str) for b in backends)):
            raise _bad("\"backends\" must be a list of backend names", source)
        single = d.get("single_backend")
        finalists = d.get("finalists")
        if finalists is not None and not isinstance(finalists, list):
            raise _bad("\"finalists\" must be a list", source)
        untimed = d.get("untimed")
        if untimed is not None and not (isinstance(untimed, list) and all(isinstance(b, str) for b in untimed)):
            raise _bad("\"untimed\" must be a list of backend names", source)
        return cls(
            seed=d.get("seed"),
            budget_s=d.get("budget_s"),
            backends=tuple(backends) if backends is not None else None,
            candidates=d.get("candidates"),
            generations=d.get("generations"),
            plans_timed=d.get("plans_timed"),
            why=d.get("why"),
            plan=ChosenTimes.from_json(d["plan"], source) if d.get("plan") is not None else None,
            dp=PlanTimes.from_json(d["dp"], source) if d.get("dp") is not None else None,
            single_backend=({n: PlanTimes.from_json(t, source)
                             for n, t in _dict(single, "\"single_backend\"", source).items()}
                            if single is not None else None),
            finalists=tuple(Finalist.from_json(f, source) for f in finalists) if finalists is not None else None,
            untimed=tuple(untimed) if untimed is not None else None,
        )


@dataclass(frozen=True)
class TunedPlan:
    """A plan with what its tuning found: per region (in ``plan.regions``' order) a ``RegionChoice``, and
    the ``TuneRecord``. A plain plan: no choices, ``record`` None."""

    plan: Plan
    choices: tuple[RegionChoice, ...] = ()
    record: TuneRecord | None = None

    def __post_init__(self) -> None:
        if self.choices and len(self.choices) != len(self.plan.regions):
            raise ValueError(f"{len(self.choices)} region choices for {len(self.plan.regions)} regions")

    def to_json(self) -> dict:
        doc = self.plan.to_json()
        for entry, choice in zip(doc["regions"], self.choices):
            entry.update(choice.to_json())
        if self.record is not None:
            doc["tuning"] = self.record.to_json()
        return doc

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "TunedPlan":
        """Reads a tuned plan document (or a plain plan); a bad plan raises ``Plan.from_json``'s
        CollageError, a malformed tuning record one CollageError line naming ``source``."""
        plan = Plan.from_json(data, source)
        assert isinstance(data, dict)  # Plan.from_json checked it
        entries = data.get("regions", [])
        choices: tuple[RegionChoice, ...] = ()
        if entries and all(any(k in e for k in _CHOICE_KEYS) for e in entries):
            choices = tuple(RegionChoice.from_json(e) for e in entries)
        tuning = data.get("tuning")
        record = TuneRecord.from_json(tuning, source) if tuning is not None else None
        return cls(plan, choices, record)
