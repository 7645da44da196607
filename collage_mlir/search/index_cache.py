"""The candidate index's regions (every backend's candidates and maximal regions), cached in the cost DB:
on ResNet-50 enumerating them walks MLIR operands through the Python bindings for ~12 s idle (the
backends' boundary checks), the largest fixed cost of a rerun. The key is the module's digest, the
backends with their versions and a digest of the code that decides candidates (every source file of
``collage_mlir`` and of each backend's module), so any change to the rules enumerates afresh."""

from __future__ import annotations

import hashlib
import inspect
import json
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from ..backends import Backend, Candidate
from ..graph import Graph
from ..measure.db import CostDB
from .candidates import enumerate_candidates
from .regions import maximal_regions

KIND = "candidate-regions"
#: Bump when the cached document's meaning changes (2: candidates with their pattern names, maximal
#: regions only under "maximal").
VERSION = 2


@lru_cache(maxsize=None)
def _source_digest(files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.encode() + b"\0" + Path(f).read_bytes())
    return digest.hexdigest()


def cache_key(module_digest: str, backends: Sequence[Backend]) -> str:
    package = Path(__file__).resolve().parents[1]
    files = {str(p) for p in package.rglob("*.py")}
    for b in backends:
        source = inspect.getsourcefile(type(b))
        if source:
            files.add(str(Path(source).resolve()))
    names = [f"{b.name}={b.version()}" for b in backends]
    text = json.dumps([VERSION, module_digest, names, _source_digest(tuple(sorted(files)))])
    return hashlib.sha256(text.encode()).hexdigest()


def cached_regions(backends: Sequence[Backend], db: CostDB, module_digest: str
                   ) -> tuple[list[Candidate], dict[str, list[frozenset[int]]]] | None:
    """(candidates, maximal regions by backend) from the DB's cache where it holds this module's under the
    same backends and code, else None."""
    doc = db.get_cached(KIND, cache_key(module_digest, backends))
    if doc is None:
        return None
    data = json.loads(doc)
    candidates = [Candidate(b, pattern, frozenset(ops)) for b, pattern, ops in data["candidates"]]
    return candidates, {b: [frozenset(r) for r in rs] for b, rs in data["maximal"].items()}


def candidate_regions(graph: Graph, backends: Sequence[Backend], db: CostDB | None = None,
                      module_digest: str | None = None, maximal: dict[str, list[frozenset[int]]] | None = None
                      ) -> tuple[list[Candidate], dict[str, list[frozenset[int]]]]:
    """(every backend's candidates, each backend's maximal regions by name): from the DB's cache when it
    holds this module's under the same backends and code, else enumerated (and cached); ``maximal``: the
    maximal regions, already found (a tune builds its seeds from them while the candidates are enumerated)."""
    if db is not None and module_digest and (found := cached_regions(backends, db, module_digest)) is not None:
        return found
    maximal = maximal if maximal is not None else {b.name: maximal_regions(graph, b) for b in backends}
    candidates = enumerate_candidates(graph, list(backends))
    if db is not None and module_digest:
        db.put_cached(KIND, cache_key(module_digest, backends), json.dumps({
            "candidates": [(c.backend, c.pattern, sorted(c.ops)) for c in candidates],
            "maximal": {b: [sorted(r) for r in rs] for b, rs in maximal.items()}}))
    return candidates, maximal
