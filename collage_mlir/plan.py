"""The placement plan: named regions (sets of op ids) → backend; JSON, versioned.

    {"format": "collage-plan", "version": 1, "default_backend": "iree-cpu",
     "regions": [{"name": "r0", "backend": "onednn", "ops": [3, 4, 5]},
                 {"name": "r1", "backend": "openvino", "ops": [6, 7], "precision": "float"}]}

Ops no region names stay on the default backend. A region's ``precision`` is ``model`` (the default:
its quantize/dequantize pairs kept) or ``float`` (each pair in it removed: it computes in float). ``validate`` checks a plan against a module's
graph and raises one CollageError line for the first problem found.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .backends import DEFAULT_BACKEND, Precision, RegionKey, get_backend, program_default
from .backends.base import crossing_type_problem
from .errors import CollageError
from .graph import Graph

FORMAT = "collage-plan"
VERSION = 1
_REGION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``Plan.key``: the default backend and the regions' keys, sorted.
PlanKey = tuple[str, tuple[RegionKey, ...]]


@dataclass(frozen=True)
class Region:
    name: str
    backend: str
    ops: frozenset[int]
    precision: Precision = Precision.MODEL

    @property
    def key(self) -> RegionKey:
        return RegionKey(self.backend, frozenset(self.ops), self.precision)

    def to_json(self) -> dict:
        out = {"name": self.name, "backend": self.backend, "ops": sorted(self.ops)}
        if self.precision is not Precision.MODEL:
            out["precision"] = self.precision.value
        return out


@dataclass
class Plan:
    regions: list[Region] = field(default_factory=list)
    default_backend: str = DEFAULT_BACKEND
    source: str = "<plan>"

    @property
    def key(self) -> PlanKey:
        """The plan as a value: its default backend and its regions' keys, sorted (region names, the
        regions' order and ``source`` do not count). Hashable and ordered: it keys and sorts plans."""
        return self.default_backend, tuple(sorted(r.key for r in self.regions))

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "default_backend": self.default_backend,
            "regions": [r.to_json() for r in self.regions],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def backend_of(self) -> dict[int, tuple[str, str]]:
        """op id → (region name, backend)."""
        return {i: (r.name, r.backend) for r in self.regions for i in r.ops}

    def precision_of(self, region: str) -> Precision:
        """The precision of the region named ``region`` (``MODEL`` for a name the plan lacks)."""
        return next((r.precision for r in self.regions if r.name == region), Precision.MODEL)

    @classmethod
    def from_json(cls, data: object, source: str = "<plan>") -> "Plan":
        """Parses the JSON document; shape errors raise one CollageError line naming ``source``."""
        def bad(msg: str) -> CollageError:
            return CollageError(msg + "; the format is in the README (plan files)", where=source)

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise bad(f"not a collage plan (expected \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise bad(f"unsupported plan version {data.get('version')!r} (this collage reads {VERSION})")
        if not isinstance(data.get("regions", []), list):
            raise bad("\"regions\" must be a list")
        if not isinstance(data.get("default_backend", DEFAULT_BACKEND), str):
            raise bad("\"default_backend\" must be a backend name")
        regions = []
        for k, r in enumerate(data.get("regions", [])):
            if not isinstance(r, dict) or not {"name", "backend", "ops"} <= r.keys():
                raise bad(f"regions[{k}] needs \"name\", \"backend\" and \"ops\"")
            if not isinstance(r["name"], str) or not _REGION_NAME.match(r["name"]):
                raise bad(f"regions[{k}]: region name {r['name']!r} must be an identifier")
            ops = r["ops"]
            if not isinstance(ops, list) or not ops or not all(type(i) is int for i in ops):
                raise bad(f"region '{r['name']}': \"ops\" must be a non-empty list of op ids")
            if not isinstance(r["backend"], str):
                raise bad(f"region '{r['name']}': \"backend\" must be a backend name")
            precision = r.get("precision", Precision.MODEL.value)
            if precision not in {p.value for p in Precision}:
                raise bad(f"region '{r['name']}': \"precision\" must be one of "
                          f"{', '.join(repr(p.value) for p in Precision)}, not {precision!r}")
            regions.append(Region(r["name"], r["backend"], frozenset(ops), Precision(precision)))
        return cls(regions, str(data.get("default_backend", DEFAULT_BACKEND)), source)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise CollageError(f"cannot read plan: {exc.strerror}", where=str(path)) from None
        except json.JSONDecodeError as exc:
            raise CollageError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                               where=str(path)) from None
        except (UnicodeDecodeError, RecursionError) as exc:
            raise CollageError(f"not a JSON text ({type(exc).__name__})", where=str(path)) from None
        return cls.from_json(data, str(path))

    def validate(self, graph: Graph) -> None:
        """Raises CollageError for an unknown op id or backend, a default backend that cannot be one, a
        backend that cannot run on the program's platform, an op the backend cannot take, a non-convex
        region, overlapping or duplicate regions."""
        platform = program_default(self.default_backend, where=self.source).platform
        owner: dict[int, str] = {}
        names: set[str] = set()
        for r in self.regions:
            where = f"{self.source}: region '{r.name}'"
            if r.name in names:
                raise CollageError("duplicate region name", where=where)
            names.add(r.name)
            # Diagnostics go on the region's first op the module has (the module itself when none).
            known = [graph.nodes[i] for i in sorted(r.ops) if i in graph.nodes]
            loc = known[0].op.location if known else None
            try:
                backend = get_backend(r.backend, where=where)
            except CollageError as exc:
                exc.location = loc
                raise
            if platform not in backend.platforms:
                raise CollageError(f"backend '{r.backend}' cannot run regions in a {platform.value} program (default "
                                   f"backend {self.default_backend}); it runs on "
                                   f"{', '.join(sorted(p.value for p in backend.platforms))}", where=where, location=loc)
            for i in sorted(r.ops):
                if i not in graph.nodes:
                    raise CollageError(f"unknown op id {i} (the module has ids {_id_range(graph)}); "
                                       "run `collage-opt --collage-number-ops` to see them", where=where)
                if i in owner:
                    raise CollageError(f"op {i} is also in region '{owner[i]}'; regions must not overlap",
                                       where=where, location=graph.nodes[i].op.location)
                owner[i] = r.name
            if not graph.is_convex(r.ops):
                raise CollageError("ops are not a convex set of one function (a path leaves the region and "
                                   "comes back); split it", where=where, location=loc)
            why = backend.accepts(graph, r.ops) or crossing_type_problem(graph, r.ops)
            if not why and r.precision is Precision.FLOAT and not r.ops & graph.dequantizing:
                why = "precision 'float' removes quantize/dequantize pairs, and the region dequantizes nothing"
            if why:
                first = graph.nodes[min(r.ops)]
                raise CollageError(f"backend '{r.backend}' cannot take it at {first.location}: {why}",
                                   where=where, location=loc)
        if not graph.regions_acyclic(r.ops for r in self.regions):
            raise CollageError("regions feed each other in a cycle (one region needs another's result and vice "
                               "versa); split or merge them", where=self.source)


def _id_range(graph: Graph) -> str:
    return f"{min(graph.nodes)}..{max(graph.nodes)}" if graph.nodes else "none"
