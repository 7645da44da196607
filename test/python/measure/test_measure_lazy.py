"""The harness looks regions up lazily: in the order given, a pair's structural hash from the DB's cache
of (module digest, op set) -> hash where a run saw it before (a warm rerun extracts nothing), and no
extraction past the deadline. The cache is a table added on first use, so older databases keep working."""

from __future__ import annotations

import sqlite3
import time

import pytest

from collage_mlir.backends import Precision, RegionKey, get_backend
from collage_mlir.measure import HARNESS_VERSION, harness
from collage_mlir.measure.db import CostDB, Measurement
from collage_mlir.measure.device import device_fingerprint
from collage_mlir.measure.extract import HASH_VERSION, extract_region
from collage_mlir.measure.harness import MeasureOptions, measure_regions, module_digest

from models import two_blocks


def _put_row(db: CostDB, region_hash: str, median_s: float = 1e-5) -> None:
    backend = get_backend("iree-cpu")
    db.put(Measurement(region_hash, backend.name, backend.version(), device_fingerprint()[0], HARNESS_VERSION, "ok",
                       median_s=median_s))


def _counting_extract(monkeypatch) -> list[frozenset[int]]:
    seen: list[frozenset[int]] = []

    def extract(graph, ops, precision=Precision.MODEL):
        seen.append(ops)
        return extract_region(graph, ops, precision)

    monkeypatch.setattr(harness, "extract_region", extract)
    return seen


@pytest.mark.fast
def test_warm_rerun_extracts_nothing_and_answers_the_same(tmp_path, monkeypatch):
    module, graph, blocks = two_blocks()
    db = CostDB(tmp_path / "costs.sqlite")
    _put_row(db, extract_region(graph, blocks[0]).hash)
    const = frozenset(i for i, n in graph.nodes.items() if n.name == "stablehlo.constant")
    regions = [RegionKey("iree-cpu", b) for b in blocks] + [RegionKey("iree-cpu", frozenset({min(const)}))]
    seen = _counting_extract(monkeypatch)
    cold = measure_regions(module, regions, db)
    assert sorted(map(sorted, seen)) == sorted(map(sorted, (r.ops for r in regions)))  # each op set extracted once
    assert cold.cache_hits == 2 and cold.measured == 0 and len(cold.skipped) == 1

    seen.clear()
    warm = measure_regions(module, regions, CostDB(tmp_path / "costs.sqlite"))
    assert seen == []  # hashes and the reason a pair cannot be posed both come from the DB
    assert warm.rows == cold.rows and warm.skipped == cold.skipped and warm.cache_hits == 2


@pytest.mark.fast
def test_lookup_is_lazy_in_the_order_given_and_stops_extracting_past_the_deadline(tmp_path, monkeypatch):
    module, graph, blocks = two_blocks()
    db = CostDB(tmp_path / "costs.sqlite")
    for b in blocks:
        _put_row(db, extract_region(graph, b).hash)

    class SpentAfter(MeasureOptions):
        """The deadline passes after the first pair's lookup (a clock-free stand-in)."""
        calls = 0

        def spent(self, ahead: float = 0.0) -> bool:
            SpentAfter.calls += 1
            return SpentAfter.calls > 1

    seen = _counting_extract(monkeypatch)
    summary = measure_regions(module, [RegionKey("iree-cpu", b) for b in blocks], db, options=SpentAfter())
    assert seen == [blocks[0]]  # the second pair would need an extraction past the deadline: not asked
    assert list(summary.rows) == [RegionKey("iree-cpu", blocks[0])] and summary.measured == 0
    # What was extracted before the deadline is cached: past it, a pair the cache knows is still answered.
    seen.clear()
    past = MeasureOptions(deadline=time.monotonic() - 1)
    summary = measure_regions(module, [RegionKey("iree-cpu", b) for b in reversed(blocks)], db, options=past)
    assert seen == [] and list(summary.rows) == [RegionKey("iree-cpu", blocks[0])]


def test_hash_cache_table_is_added_to_an_existing_database(tmp_path):
    path = tmp_path / "costs.sqlite"
    CostDB(path).close()
    with sqlite3.connect(path) as c:  # a database written before the cache existed has no such table
        assert "region_hashes" not in {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    module, graph, blocks = two_blocks()
    with CostDB(path) as db:
        assert db.region_hashes(module_digest(module), HASH_VERSION) == {}
        measure_regions(module, [RegionKey("iree-cpu", blocks[0])], db, options=MeasureOptions(capture_s=1e9, deadline=1e18))
    with CostDB(path) as db:
        key = ",".join(map(str, sorted(blocks[0])))
        assert db.region_hashes(module_digest(module), HASH_VERSION) == {key: (extract_region(graph, blocks[0]).hash, "")}
        assert db.region_hashes(module_digest(module), HASH_VERSION + 1) == {}  # a new hash rule starts afresh
