"""The cost seam between the search and whatever prices regions: a ``Cost`` value that tells a known
time from an unknown one (not measured, budget spent) and an invalid one (the backend fails or is wrong
on it), and the ``CostEstimator`` interface (region cost, transition cost per bytes crossing, whole-plan
time), and ``plan_cost``, a plan's additive price under an estimator (what the DP minimizes).
``MockEstimator`` is a deterministic stand-in for tests; the measured one is in ``measured.py``."""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

from ..backends import DEFAULT_BACKEND, RegionKey
from ..plan import Plan


class CostKind(str, Enum):
    KNOWN = "known"
    UNKNOWN = "unknown"  # not measured (yet): budget spent, not posed
    INVALID = "invalid"  # measured and unusable: build or run failed, wrong numbers


@dataclass(frozen=True)
class Cost:
    kind: CostKind
    seconds: float = math.inf
    reason: str = ""
    spread: float = 0.0  # relative inter-quartile spread of the samples behind ``seconds``
    #: Known, but not measured alone: read off an engine's per-node profile of a larger region that holds
    #: it (``measure.profile``: "in context"); ``reason`` says whose.
    estimated: bool = False

    @classmethod
    def known(cls, seconds: float, reason: str = "", spread: float = 0.0) -> "Cost":
        return cls(CostKind.KNOWN, seconds, reason, spread)

    @classmethod
    def in_context(cls, seconds: float, reason: str) -> "Cost":
        """A known cost from an engine's profile of a larger region (``estimated``)."""
        return cls(CostKind.KNOWN, seconds, reason, 0.0, True)

    @classmethod
    def unknown(cls, reason: str) -> "Cost":
        return cls(CostKind.UNKNOWN, math.inf, reason)

    @classmethod
    def invalid(cls, reason: str) -> "Cost":
        return cls(CostKind.INVALID, math.inf, reason)

    @property
    def usable(self) -> bool:
        return self.kind is CostKind.KNOWN


@dataclass(frozen=True)
class TransitionFit:
    """Boundary cost ``fixed_s + per_byte_s * nbytes``, least-squares over probes of several sizes."""

    fixed_s: float
    per_byte_s: float
    sizes: tuple[int, ...] = ()

    def at(self, nbytes: int) -> float:
        # Never below zero: the probe times a two-region program against each region alone, and each
        # alone pays a program call's own overhead (~70 us for IREE here), so small crossings measure
        # negative (-3 to -114 us on a Zen 5 machine); priced as such, every extra boundary made a DP
        # plan look faster (ResNet-50: 74 regions predicted at 12.4 ms, measured 46).
        return max(0.0, self.fixed_s + self.per_byte_s * nbytes)

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> "TransitionFit":
        import numpy as np

        if len(points) < 2:
            raise ValueError("a transition fit needs at least two probe sizes")
        x = np.array([p[0] for p in points], dtype=float)
        y = np.array([p[1] for p in points], dtype=float)
        slope, intercept = np.polyfit(x, y, 1)
        return cls(float(intercept), float(slope), tuple(int(v) for v in x))


def transition_seconds(cost: Cost) -> float:
    """A boundary's cost for the DP: an unknown one (probes not measured within the budget) counts as
    free, since the graph-level search judges whole plans by measured time anyway; an invalid one bars it."""
    if cost.usable:
        return cost.seconds
    return 0.0 if cost.kind is CostKind.UNKNOWN else math.inf


class CostEstimator(ABC):
    """What the search knows of costs. Region costs are asked in batches, only for candidates the
    search reaches (a measured estimator measures them then, and reuses its database)."""

    default_backend: str = DEFAULT_BACKEND

    @abstractmethod
    def region_costs(self, regions: Sequence[RegionKey]) -> list[Cost]:
        """The cost of running each region's ops as one region on its backend."""

    @abstractmethod
    def transition_cost(self, src: str, dst: str, nbytes: int) -> Cost:
        """What a boundary adds when ``nbytes`` flow from a region on ``src`` into one on ``dst``."""

    @abstractmethod
    def plan_time(self, plan: Plan, tag: str = "") -> Cost:
        """End-to-end time of the whole model built by ``plan``; ``tag`` names a repeated measurement
        (an estimator that caches answers keeps one answer per tag)."""

    def retime_s(self, seconds: float, plan: Plan | None = None) -> float:
        """Wall seconds a new ``plan_time`` (another tag) of a plan taking ``seconds`` a call costs, its build
        included where ``plan`` is given and its build is not at hand: what the finalists' rounds are
        budgeted by. Free unless the estimator measures."""
        return 0.0


def plan_cost(plan: Plan, order: Sequence[int], producers: dict[int, Sequence[int]], out_bytes: dict[int, int],
              estimator: CostEstimator, constant: frozenset[int] = frozenset(),
              pinned: Mapping[int, str] | None = None) -> float:
    """The additive cost of ``plan``: its regions, every other op alone on the default backend (a
    ``pinned`` op on its backend, as ``collage-assign`` places it), and one transition per (producer op,
    consuming region) crossing a boundary (as the DP counts them); inf when a region or boundary is invalid."""

    regions = [r.key for r in plan.regions]
    covered = {i for r in regions for i in r.ops}
    regions += [RegionKey((pinned or {}).get(i, estimator.default_backend), frozenset({i}))
                for i in order if i not in covered]
    label = {i: r.backend for r in regions for i in r.ops}
    total = 0.0
    for cost in estimator.region_costs(regions):
        if not cost.usable:
            return math.inf
        total += cost.seconds
    for r in regions:
        for p in sorted({p for q in r.ops for p in producers.get(q, ()) if p not in r.ops and p not in constant}):
            total += transition_seconds(estimator.transition_cost(label[p], r.backend, out_bytes[p]))
    return total


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts`` (the mock's costs do not depend on PYTHONHASHSEED)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class MockEstimator(CostEstimator):
    """Deterministic costs from a seed, no compiler: each (op, backend) has a base time, a region costs
    the sum of its ops' times less a fusion discount per extra op, some pairs are invalid, transitions
    cost a fixed part plus a per-byte part (none between default-backend ops). ``plan_time`` is the
    additive cost (what the DP optimizes) times a plan-dependent factor in [1, 1 + nonadditive), so the
    graph-level search has something the DP cannot see. Counts every question it is asked."""

    def __init__(self, seed: int, ops: Sequence[int], out_bytes: dict[int, int], *, invalid_rate: float = 0.15,
                 nonadditive: float = 0.0, producers: dict[int, Sequence[int]] | None = None):
        self.seed = seed
        self.ops = list(ops)
        self.out_bytes = out_bytes
        self.producers = producers or {}
        self.invalid_rate = invalid_rate
        self.nonadditive = nonadditive
        self.asked: list[RegionKey] = []
        self.plans_timed = 0

    def region_costs(self, regions):
        out = []
        for region in regions:
            self.asked.append(region)
            ops, backend = region.ops, region.backend
            if backend != self.default_backend and _unit(self.seed, "bad", sorted(ops), backend) < self.invalid_rate:
                out.append(Cost.invalid("mock: wrong numbers"))
                continue
            base = sum(1e-4 * (0.2 + _unit(self.seed, op, backend)) for op in ops)
            out.append(Cost.known(base * (1 - 0.08 * (len(ops) - 1)) if len(ops) < 10 else base * 0.3))
        return out

    def transition_cost(self, src, dst, nbytes):
        if src == dst == self.default_backend:
            return Cost.known(0.0)
        return Cost.known(2e-6 * (1 + _unit(self.seed, src, dst)) + 1e-11 * nbytes)

    def additive_time(self, plan: Plan) -> float:
        """Sum of region costs (every other op alone on the default backend) and boundary costs."""
        return plan_cost(plan, self.ops, self.producers, self.out_bytes, self)

    def plan_time(self, plan, tag=""):
        self.plans_timed += 1
        t = self.additive_time(plan)
        if not math.isfinite(t):
            return Cost.invalid("mock: a region is invalid")
        key = sorted((r.backend, sorted(r.ops)) for r in plan.regions)
        return Cost.known(t * (1 + self.nonadditive * _unit(self.seed, "plan", key)), spread=0.01)
