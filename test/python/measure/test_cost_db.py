"""The cost database: rows and failures, concurrent writers, a writer killed mid-stream, JSON export and
import, prune, non-database files, and `collage db` end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collage_mlir.errors import CollageError
from collage_mlir.measure import HARNESS_VERSION
from collage_mlir.measure.db import CostDB, Measurement, Transition, default_db_path

from helpers import ROOT



def meas(region_hash: str = "r0", backend: str = "onednn", status: str = "ok", **kw) -> Measurement:
    base = dict(backend_version="v1", device="dev0", harness_version=1, median_s=1e-3 if status == "ok" else None)
    return Measurement(region_hash=region_hash, backend=backend, status=status, **(base | kw))


def trans(src: str = "iree-cpu", dst: str = "onednn", **kw) -> Transition:
    base = dict(src_version="v1", dst_version="v1", device="dev0", harness_version=1, nbytes=4096, status="ok",
                cost_s=2e-6)
    return Transition(src=src, dst=dst, **(base | kw))


def integrity(path: Path) -> str:
    with sqlite3.connect(path) as c:
        return c.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.mark.fast
def test_put_get_roundtrip_and_failures(tmp_path):
    with CostDB(tmp_path / "sub" / "c.sqlite") as db:
        m = meas(min_s=9e-4, spread=0.02, repeats=20, threads=2, max_abs_err=1e-6, max_rel_err=1e-5,
                 region="stablehlo.convolution 1x3x8x8xf32")
        db.put(m)
        assert db.get(*m.key()) == m and m.usable
        crash = meas("r1", status="crash", message="worker died with SIGSEGV")
        db.put(crash)
        got = db.get(*crash.key())
        assert got == crash and not got.usable and got.median_s is None
        assert db.get("r0", "onednn", "v2", "dev0", 1) is None
        # Upsert: the same key replaces the row.
        db.put(meas(status="wrong", max_abs_err=3.0, message="beyond tolerance"))
        assert db.get(*m.key()).status == "wrong" and len(db.measurements()) == 2
        assert [x.region_hash for x in db.measurements(region_hash="r1")] == ["r1"]
        with pytest.raises(CollageError, match="unknown measurement status 'slow'"):
            db.put(meas(status="slow"))
        t = trans(cost_s=-1e-7)
        db.put_transition(t)
        assert db.get_transition(*t.key()) == t and db.transitions(device="dev1") == []
        db.record_device("dev0", "cpu x86_64 test")
        s = db.stats()
        assert s["measurements"] == 2 and s["transitions"] == 1 and s["size_bytes"] > 0
        assert s["by_backend"] == {"onednn": {"wrong": 1, "crash": 1}}
        assert s["devices"] == [{"fingerprint": "dev0", "description": "cpu x86_64 test"}]


@pytest.mark.fast
def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLAGE_DB", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("COLLAGE_DB")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    assert default_db_path() == tmp_path / "cache" / "costs.sqlite"


WRITER = textwrap.dedent("""
    import sys, time
    from collage_mlir.measure.db import CostDB, Measurement
    path, tag, n, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "wait"
    if wait:  # start together once every writer has imported
        sys.stdin.readline()
    db = CostDB(path)
    for i in range(n):
        db.put(Measurement(f"{tag}-{i}", "onednn", "v1", "dev0", 1, "ok", median_s=i * 1e-6, message="x" * 200))
        print(i + 1, flush=True)
        if wait:  # measuring takes time between writes; without it one writer can hog the lock
            time.sleep(0.002)
""")


def writer(path: Path, tag: str, n: int, wait: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, str(n), "wait" if wait else "go"],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_concurrent_writers(tmp_path):
    # All four open a fresh file at once: schema creation and the switch to WAL must race safely too.
    path = tmp_path / "c.sqlite"
    procs = [writer(path, f"w{k}", 100, wait=True) for k in range(4)]
    time.sleep(0.5)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with CostDB(path) as db:
        rows = db.measurements()
    assert len(rows) == 400 and {r.region_hash for r in rows} == {f"w{k}-{i}" for k in range(4) for i in range(100)}
    assert integrity(path) == "ok"
    # The writers really interleaved (not four blocks one after another).
    order = [r.region_hash.split("-")[0] for r in sorted(rows, key=lambda r: r.created)]
    assert sum(a != b for a, b in zip(order, order[1:])) > 10


def test_killed_writer_loses_no_committed_row(tmp_path):
    path = tmp_path / "c.sqlite"
    p = writer(path, "k", 100_000)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 150 and time.monotonic() < deadline:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        seen = int(line)
    os.kill(p.pid, signal.SIGKILL)
    # Lines still in the pipe were printed after their commit too.
    seen = max([seen] + [int(x) for x in p.stdout.read().split()])
    p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL and seen >= 150
    assert integrity(path) == "ok"
    with CostDB(path) as db:
        have = {m.region_hash for m in db.measurements()}
        assert {f"k-{i}" for i in range(seen)} <= have
        db.put(meas("after-kill"))
        assert db.get(*meas("after-kill").key()) is not None


@pytest.mark.fast
def test_export_import_roundtrip_and_merge(tmp_path):
    src = CostDB(tmp_path / "a.sqlite")
    rows = [meas("r0"), meas("r1", status="timeout", message="hung for 60 s"),
            meas("r2", backend="xla-cpu", max_abs_err=float("inf"), status="wrong")]
    for m in rows:
        src.put(m)
    src.put_transition(trans())
    src.record_device("dev0", "test cpu")
    assert src.export_json(tmp_path / "out" / "e.json") == 4
    json.loads((tmp_path / "out" / "e.json").read_text())  # strict JSON, inf included

    with CostDB(tmp_path / "b.sqlite") as dst:
        assert dst.import_json(tmp_path / "out" / "e.json") == (4, 0)
        assert dst.measurements() == src.measurements() and dst.transitions() == src.transitions()
        assert dst.stats()["devices"] == [{"fingerprint": "dev0", "description": "test cpu"}]
        assert dst.import_json(tmp_path / "out" / "e.json") == (0, 4)  # equal rows are skipped

        # Per key the newer row wins, whichever side it is on.
        newer = meas("r0", median_s=5e-3, created=rows[0].created + 10)
        dst.put(newer)
        src.put(meas("r1", median_s=2e-3, created=rows[1].created + 10))
        src.export_json(tmp_path / "e2.json")
        assert dst.import_json(tmp_path / "e2.json") == (1, 3)
        assert dst.get(*newer.key()).median_s == 5e-3
        assert dst.get(*rows[1].key()).status == "ok"
    src.close()


@pytest.mark.fast
@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"format": "other"}', "not a collage cost export"),
    ('{"format": "collage-costs", "version": 1, "measurements": [{"region_hash": "r"}]}',
     "measurements[0]: missing field 'backend'"),
    ('{"format": "collage-costs", "version": 1, "transitions": {}}', "'transitions' must be a list"),
])
def test_import_rejects_bad_files(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    with CostDB(tmp_path / "c.sqlite") as db:
        with pytest.raises(CollageError, match=re.escape(message)) as exc:
            db.import_json(bad)
        assert str(bad) in str(exc.value) and "\n" not in str(exc.value)
        assert db.measurements() == []


@pytest.mark.fast
def test_import_checks_every_row_before_writing(tmp_path):
    good = json.loads(json.dumps(meas().__dict__))
    doc = {"format": "collage-costs", "version": 1,
           "measurements": [good, good | {"region_hash": "r9", "status": "meh"}]}
    (tmp_path / "e.json").write_text(json.dumps(doc))
    with CostDB(tmp_path / "c.sqlite") as db:
        with pytest.raises(CollageError, match=r"measurements\[1\]: unknown status 'meh'"):
            db.import_json(tmp_path / "e.json")
        assert db.measurements() == []
        doc["measurements"][1] = good | {"repeats": "many"}
        (tmp_path / "e.json").write_text(json.dumps(doc))
        with pytest.raises(CollageError, match=r"measurements\[1\]: field 'repeats' must be an integer"):
            db.import_json(tmp_path / "e.json")


@pytest.mark.fast
def test_prune(tmp_path):
    old = time.time() - 40 * 86400
    with CostDB(tmp_path / "c.sqlite") as db:
        for m in [meas("keep"), meas("old-harness", harness_version=0), meas("stale", backend_version="v0"),
                  meas("other-device", backend_version="v0", device="dev1"),
                  meas("unknown-backend", backend="gone", backend_version="v0"),
                  meas("failed", status="error", message="build failed"), meas("ancient", created=old)]:
            db.put(m)
        for t in [trans(), trans(src_version="v0"), trans(dst="ort", dst_version="v7"), trans(harness_version=0)]:
            db.put_transition(t)
        versions = {"onednn": "v1", "iree-cpu": "v1", "ort": "v8"}
        assert db.prune(harness_version=1, current_versions=versions, device="dev0") == 5
        assert {m.region_hash for m in db.measurements()} == {"keep", "other-device", "unknown-backend", "failed",
                                                               "ancient"}
        assert [t.key() for t in db.transitions()] == [trans().key()]
        assert db.prune(harness_version=1, current_versions=versions, device="dev0", failures=True) == 1
        assert db.prune(harness_version=1, current_versions=versions, device="dev0", older_than_days=30) == 1
        assert {m.region_hash for m in db.measurements()} == {"keep", "other-device", "unknown-backend"}
    assert integrity(tmp_path / "c.sqlite") == "ok"


@pytest.mark.fast
def test_non_database_files_are_refused(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not SQLite\n" * 100)
    with pytest.raises(CollageError, match="not a collage cost database") as exc:
        CostDB(text)
    assert str(text) in str(exc.value)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    with pytest.raises(CollageError, match="not a collage cost database"):
        CostDB(other)
    assert text.read_text().startswith("hello")  # refused, not overwritten


# -- `collage db` ----------------------------------------------------------------------------------

# Until cli.py wires `db`, the same argparse plumbing in miniature.
MINI_CLI = textwrap.dedent("""
    import argparse, sys
    from collage_mlir.tools import db_cmd, exit_quietly, run_tool
    p = argparse.ArgumentParser(prog="collage")
    db_cmd.add_parser(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(sys.argv[1:])
    exit_quietly(run_tool("collage", lambda: db_cmd.run(args)))
""")


def collage(*args: str) -> subprocess.CompletedProcess:
    from collage_mlir.tools import cli

    argv = ["-m", "collage_mlir.tools.cli"] if "db" in cli.COMMANDS else ["-c", MINI_CLI]
    return subprocess.run([sys.executable, *argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_db_cli(tmp_path):
    db = str(tmp_path / "c.sqlite")
    with CostDB(db) as d:
        # Rows of this harness: `db prune --failures` removes the failure, not rows of an older harness.
        d.put(meas(harness_version=HARNESS_VERSION))
        d.put(meas("r1", status="crash", harness_version=HARNESS_VERSION))
        d.record_device("dev0", "test cpu")
    r = collage("db", "stats", "--db", db)
    assert r.returncode == 0, r.stderr
    assert "onednn" in r.stdout and "crash" in r.stdout and "test cpu" in r.stdout
    r = collage("db", "export", str(tmp_path / "e.json"), "--db", db)
    assert r.returncode == 0 and "exported 2 rows" in r.stdout, r.stderr
    r = collage("db", "import", str(tmp_path / "e.json"), "--db", str(tmp_path / "d.sqlite"))
    assert r.returncode == 0 and "imported 2 rows" in r.stdout, r.stderr
    r = collage("db", "import", str(tmp_path / "missing.json"), "--db", db)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "missing.json: no such file" in r.stderr
    r = collage("db", "stats", "--db", str(tmp_path / "e.json"))
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not a collage cost database" in r.stderr
    r = collage("db", "prune", "--failures", "--db", db)
    assert r.returncode == 0 and "pruned 1 rows" in r.stdout, r.stderr
