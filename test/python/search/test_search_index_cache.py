"""The candidate index's regions come from the cost DB on a rerun (no enumeration), equal to what
enumeration gives; other backends (or other code) are another key."""

from __future__ import annotations

import pytest

from collage_mlir.backends import get_backend
from collage_mlir.measure.db import CostDB
from collage_mlir.measure.harness import module_digest
from collage_mlir.search import index_cache

from models import two_blocks

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`


def test_rerun_reads_the_candidates_enumeration_found(tmp_path, monkeypatch):
    module, graph, _ = two_blocks()
    backends = [get_backend("iree-cpu"), get_backend("onednn")]
    digest = module_digest(module)
    db = CostDB(tmp_path / "costs.sqlite")
    fresh = index_cache.candidate_regions(graph, backends, db, digest)
    assert fresh == index_cache.candidate_regions(graph, backends)  # without a DB: the same enumeration
    assert any(c.backend == "onednn" for c in fresh[0])

    def refuse(*a, **k):
        raise AssertionError("enumerated again")

    monkeypatch.setattr(index_cache, "enumerate_candidates", refuse)
    monkeypatch.setattr(index_cache, "maximal_regions", refuse)
    cached = index_cache.candidate_regions(graph, backends, CostDB(tmp_path / "costs.sqlite"), digest)
    assert cached == fresh
    try:
        index_cache.candidate_regions(graph, backends[:1], db, digest)  # other backends: another key
    except AssertionError as exc:
        assert "enumerated again" in str(exc)
    else:
        raise AssertionError("a different backend set was answered from the cache")
