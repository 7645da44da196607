"""The persistent cost database: one SQLite file (WAL) of measured regions and backend transitions.

A measurement is keyed by (region structural hash, backend, backend version, device fingerprint,
harness version), so a new backend release, another machine or a changed harness never reuses stale
numbers. Failures are rows too, so a region that crashes a backend is not retried on every search.

Every write is its own short ``BEGIN IMMEDIATE ... COMMIT`` with ``synchronous=FULL``: several
processes can write at once, and a writer killed with SIGKILL loses at most the row it was writing.
Interchange is JSON (``export_json`` / ``import_json``), never pickle.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from ..errors import CollageError
from .status import Status

#: The statuses a row may have (``Status``), as stored.
STATUSES = tuple(s.value for s in Status)


def _status(value: str) -> Status | str:
    """A stored status as the enum (a status a newer collage wrote stays the string it is)."""
    return Status(value) if value in STATUSES else value

SCHEMA_VERSION = 1
FORMAT = "collage-costs"
EXPORT_VERSION = 1
BUSY_TIMEOUT_S = 60.0


@dataclass
class Measurement:
    """One (region, backend, version, device, harness) result; failures carry a message and no timings."""

    region_hash: str
    backend: str
    backend_version: str
    device: str
    harness_version: int
    status: Status
    median_s: float | None = None
    min_s: float | None = None
    spread: float | None = None  # relative inter-quartile spread of the samples
    repeats: int | None = None
    threads: int | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    message: str = ""
    region: str = ""  # human-readable summary of the region (op names, shapes)
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.status = _status(self.status)

    def key(self) -> tuple[str, str, str, str, int]:
        return (self.region_hash, self.backend, self.backend_version, self.device, self.harness_version)

    @property
    def usable(self) -> bool:
        """Only validated timings may ever be chosen by a search."""
        return self.status == Status.OK


@dataclass
class Transition:
    """The extra cost of handing ``nbytes`` from backend ``src`` to backend ``dst`` at a region boundary."""

    src: str
    dst: str
    src_version: str
    dst_version: str
    device: str
    harness_version: int
    nbytes: int  # bytes crossing the boundary in the probe
    status: Status  # OK or a failure
    cost_s: float | None = None  # extra seconds per boundary (may be negative)
    message: str = ""
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.status = _status(self.status)

    @property
    def usable(self) -> bool:
        """Only a measured boundary cost may price a plan."""
        return self.status == Status.OK

    def key(self) -> tuple:
        return (self.src, self.dst, self.src_version, self.dst_version, self.device, self.harness_version,
                self.nbytes)


#: The fields of a Measurement's key, in ``Measurement.key()`` order.
KEY_FIELDS = ("region_hash", "backend", "backend_version", "device", "harness_version")
_M_KEY = KEY_FIELDS
_T_KEY = ("src", "dst", "src_version", "dst_version", "device", "harness_version", "nbytes")
_M_COLS = tuple(f.name for f in fields(Measurement))
_T_COLS = tuple(f.name for f in fields(Transition))

_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE measurements (
    region_hash TEXT NOT NULL, backend TEXT NOT NULL, backend_version TEXT NOT NULL, device TEXT NOT NULL,
    harness_version INTEGER NOT NULL, status TEXT NOT NULL,
    median_s REAL, min_s REAL, spread REAL, repeats INTEGER, threads INTEGER, max_abs_err REAL, max_rel_err REAL,
    message TEXT NOT NULL DEFAULT '', region TEXT NOT NULL DEFAULT '', created REAL NOT NULL,
    PRIMARY KEY ({", ".join(_M_KEY)}));
CREATE TABLE transitions (
    src TEXT NOT NULL, dst TEXT NOT NULL, src_version TEXT NOT NULL, dst_version TEXT NOT NULL,
    device TEXT NOT NULL, harness_version INTEGER NOT NULL, nbytes INTEGER NOT NULL, status TEXT NOT NULL,
    cost_s REAL, message TEXT NOT NULL DEFAULT '', created REAL NOT NULL,
    PRIMARY KEY ({", ".join(_T_KEY)}));
CREATE TABLE devices (fingerprint TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE INDEX measurements_by_backend ON measurements (backend, device);
"""

# Created on first use, so databases of this schema version gain it without a migration.
_PLANS_TABLE = """CREATE TABLE IF NOT EXISTS plans (module_hash TEXT NOT NULL, device TEXT NOT NULL,
    document TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (module_hash, device))"""

# Also created on first use: (module digest, op set) -> the region's structural hash (NULL and why where
# the region cannot be posed), so a rerun on a model looks its regions up without extracting them.
_HASHES_TABLE = """CREATE TABLE IF NOT EXISTS region_hashes (module_hash TEXT NOT NULL, ops TEXT NOT NULL,
    hash_version INTEGER NOT NULL, region_hash TEXT, why TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (module_hash, hash_version, ops))"""

# Also created on first use: derived data a rerun can skip recomputing (the search's candidate regions),
# by kind and a key that covers everything it was derived from.
_CACHE_TABLE = """CREATE TABLE IF NOT EXISTS derived (kind TEXT NOT NULL, key TEXT NOT NULL, document TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (kind, key))"""


def default_db_path() -> Path:
    """``$COLLAGE_DB`` if set, else ``costs.sqlite`` in the user's collage cache directory."""
    if os.environ.get("COLLAGE_DB"):
        return Path(os.environ["COLLAGE_DB"])
    from ..frontends import cache_dir

    return cache_dir() / "costs.sqlite"


class CostDB:
    """A cost database file; safe to open from several processes at once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # one connection, possibly shared by a harness's threads
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise CollageError(f"cannot open cost database: {exc}", where=str(self.path)) from None
        try:
            self._setup()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.OperationalError):  # unreadable, read-only, locked past the timeout
                raise CollageError(f"cannot use cost database: {exc}", where=str(self.path)) from None
            if isinstance(exc, sqlite3.DatabaseError):  # "file is not a database"
                raise CollageError(f"not a collage cost database ({exc})", where=str(self.path)) from None
            raise

    def _setup(self) -> None:
        c = self._conn
        # Switching a fresh file to WAL needs an exclusive lock; a process opening the file at the same
        # moment can get SQLITE_BUSY without the busy handler being consulted, so retry here.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                c.execute("PRAGMA journal_mode=WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        c.execute("PRAGMA synchronous=FULL")
        with self._tx():
            tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:  # a fresh file; the IMMEDIATE lock makes exactly one opener create it
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    c.execute(stmt)
                c.executemany("INSERT INTO meta VALUES (?, ?)",
                              [("format", FORMAT), ("schema_version", str(SCHEMA_VERSION))])
                return
            try:
                meta = dict(c.execute("SELECT key, value FROM meta"))
            except sqlite3.OperationalError:  # no meta table, or someone else's
                meta = {}
        if meta.get("format") != FORMAT:
            raise CollageError("not a collage cost database (an SQLite file without collage's meta table)",
                               where=str(self.path))
        version = int(meta.get("schema_version", "0"))
        if version != SCHEMA_VERSION:
            raise CollageError(f"cost database schema version {version}, this collage reads version "
                               f"{SCHEMA_VERSION}; export it with the collage that wrote it, or use another --db",
                               where=str(self.path))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so concurrent writers wait in the busy handler
        # instead of failing on a read-to-write lock upgrade.
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:  # locked for the whole busy timeout, disk full, I/O error
                raise CollageError(f"cost database write failed: {exc}", where=str(self.path)) from None

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # -- measurements ------------------------------------------------------------------------------

    def get(self, region_hash: str, backend: str, backend_version: str, device: str,
            harness_version: int) -> Measurement | None:
        """The stored measurement with this key, or None."""
        rows = self._query(f"SELECT {', '.join(_M_COLS)} FROM measurements WHERE "
                           + " AND ".join(f"{k} = ?" for k in _M_KEY),
                           (region_hash, backend, backend_version, device, harness_version))
        return Measurement(*rows[0]) if rows else None

    def put(self, m: Measurement) -> None:
        """Insert or replace the row with ``m``'s key; committed before this returns.

        A NaN error reads back as None: SQLite stores NaN as NULL (infinities are kept)."""
        _check_status(m.status)
        with self._tx() as c:
            _insert(c, "measurements", _M_COLS, asdict(m))

    def measurements(self, *, backend: str | None = None, device: str | None = None,
                     region_hash: str | None = None) -> list[Measurement]:
        """Every measurement matching the given filters, in key order."""
        where, params = _filters(backend=backend, device=device, region_hash=region_hash)
        rows = self._query(f"SELECT {', '.join(_M_COLS)} FROM measurements{where} ORDER BY {', '.join(_M_KEY)}",
                           params)
        return [Measurement(*r) for r in rows]

    # -- transitions -------------------------------------------------------------------------------

    def put_transition(self, t: Transition) -> None:
        """Insert or replace the transition row with ``t``'s key; committed before this returns."""
        _check_status(t.status)
        with self._tx() as c:
            _insert(c, "transitions", _T_COLS, asdict(t))

    def get_transition(self, src: str, dst: str, src_version: str, dst_version: str, device: str,
                       harness_version: int, nbytes: int) -> Transition | None:
        """The stored transition with this key, or None."""
        rows = self._query(f"SELECT {', '.join(_T_COLS)} FROM transitions WHERE "
                           + " AND ".join(f"{k} = ?" for k in _T_KEY),
                           (src, dst, src_version, dst_version, device, harness_version, nbytes))
        return Transition(*rows[0]) if rows else None

    def transitions(self, *, device: str | None = None) -> list[Transition]:
        """Every transition (of ``device`` if given), in key order."""
        where, params = _filters(device=device)
        rows = self._query(f"SELECT {', '.join(_T_COLS)} FROM transitions{where} ORDER BY {', '.join(_T_KEY)}",
                           params)
        return [Transition(*r) for r in rows]

    # -- tuned plans -------------------------------------------------------------------------------

    def put_plan(self, module_hash: str, device: str, document: dict) -> None:
        """Remembers the plan document ``collage tune`` found for a module (by structural hash) on ``device``."""
        with self._tx() as c:
            c.execute(_PLANS_TABLE)
            c.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?, ?)",
                      (module_hash, device, json.dumps(document, sort_keys=True), time.time()))

    def get_plan(self, module_hash: str, device: str) -> dict | None:
        """The plan document last tuned for the module on ``device``, or None."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='plans'"):
            return None
        rows = self._query("SELECT document FROM plans WHERE module_hash=? AND device=?", (module_hash, device))
        return json.loads(rows[0][0]) if rows else None

    # -- region hashes -----------------------------------------------------------------------------

    def region_hashes(self, module_hash: str, hash_version: int) -> dict[str, tuple[str | None, str]]:
        """Every cached op set of the module (ids joined by commas) -> (structural hash or None, why not)."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='region_hashes'"):
            return {}
        rows = self._query("SELECT ops, region_hash, why FROM region_hashes WHERE module_hash=? AND hash_version=?",
                           (module_hash, hash_version))
        return {ops: (h, why) for ops, h, why in rows}

    def put_region_hashes(self, module_hash: str, hash_version: int,
                          entries: list[tuple[str, str | None, str]]) -> None:
        """Caches (op set, structural hash or None, why not) of the module's regions, in one transaction."""
        if not entries:
            return
        with self._tx() as c:
            c.execute(_HASHES_TABLE)
            c.executemany("INSERT OR REPLACE INTO region_hashes VALUES (?, ?, ?, ?, ?)",
                          [(module_hash, ops, hash_version, h, why) for ops, h, why in entries])

    def get_cached(self, kind: str, key: str) -> str | None:
        """The derived document stored under (``kind``, ``key``), or None."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='derived'"):
            return None
        rows = self._query("SELECT document FROM derived WHERE kind=? AND key=?", (kind, key))
        return rows[0][0] if rows else None

    def cached_documents(self, kind: str) -> list[str]:
        """Every derived document of ``kind``, newest first."""
        if not self._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='derived'"):
            return []
        return [d for (d,) in self._query("SELECT document FROM derived WHERE kind=? ORDER BY created DESC", (kind,))]

    def put_cached(self, kind: str, key: str, document: str) -> None:
        """Stores a derived document (replacing any under the same kind and key)."""
        with self._tx() as c:
            c.execute(_CACHE_TABLE)
            c.execute("INSERT OR REPLACE INTO derived VALUES (?, ?, ?, ?)", (kind, key, document, time.time()))

    # -- devices, stats ----------------------------------------------------------------------------

    def record_device(self, fingerprint: str, description: str) -> None:
        """Remember what a device fingerprint stands for, for humans reading stats and exports."""
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO devices VALUES (?, ?)", (fingerprint, description))

    def _devices(self) -> list[dict[str, str]]:
        return [{"fingerprint": f, "description": d}
                for f, d in self._query("SELECT fingerprint, description FROM devices ORDER BY fingerprint")]

    def stats(self) -> dict:
        """Row counts by backend and status, devices, and the file's size (database plus WAL)."""
        by_backend: dict[str, dict[str, int]] = {}
        for backend, status, n in self._query(
                "SELECT backend, status, COUNT(*) FROM measurements GROUP BY backend, status ORDER BY backend"):
            by_backend.setdefault(backend, {})[status] = n
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return {
            "path": str(self.path),
            "size_bytes": size,
            "measurements": self._query("SELECT COUNT(*) FROM measurements")[0][0],
            "transitions": self._query("SELECT COUNT(*) FROM transitions")[0][0],
            "devices": self._devices(),
            "by_backend": by_backend,
        }

    # -- JSON interchange --------------------------------------------------------------------------

    def export_json(self, path: str | Path) -> int:
        """Write every row as JSON; returns the number of measurements plus transitions written."""
        ms, ts = self.measurements(), self.transitions()
        doc = {"format": FORMAT, "version": EXPORT_VERSION, "devices": self._devices(),
               "measurements": [_json_row(asdict(m)) for m in ms],
               "transitions": [_json_row(asdict(t)) for t in ts]}
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written aside and renamed, so an interrupted export never leaves half a file under the name.
            tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            raise CollageError(f"cannot write export: {exc.strerror or exc}", where=str(path)) from None
        return len(ms) + len(ts)

    def import_json(self, path: str | Path) -> tuple[int, int]:
        """Merge an export into this database: per key the row with the newer ``created`` wins.

        Returns (rows written, rows skipped as older or equal). The whole file is checked before
        anything is written, and the merge is one transaction.
        """
        ms, ts, devices = _read_export(Path(path))
        written = skipped = 0
        with self._tx() as c:
            for table, cols, keycols, rows in (("measurements", _M_COLS, _M_KEY, ms),
                                               ("transitions", _T_COLS, _T_KEY, ts)):
                for row in rows:
                    where = " AND ".join(f"{k} = ?" for k in keycols)
                    old = c.execute(f"SELECT created FROM {table} WHERE {where}",
                                    tuple(row[k] for k in keycols)).fetchone()
                    if old is not None and old[0] >= row["created"]:
                        skipped += 1
                        continue
                    _insert(c, table, cols, row)
                    written += 1
            for d in devices:
                c.execute("INSERT OR IGNORE INTO devices VALUES (?, ?)", (d["fingerprint"], d["description"]))
        return written, skipped

    # -- maintenance -------------------------------------------------------------------------------

    def prune(self, *, harness_version: int, current_versions: dict[str, str], device: str,
              failures: bool = False, older_than_days: float | None = None) -> int:
        """Delete rows that can no longer be used; returns how many, then compacts the file.

        Goes: rows of an older harness version; rows of ``device`` whose backend version differs from
        ``current_versions`` (backends not listed there, and other devices, are kept: this machine cannot
        tell what is current elsewhere); with ``failures`` every non-ok row; with ``older_than_days``
        rows created longer ago than that.
        """
        deleted = 0
        with self._tx() as c:
            def delete(table: str, cond: str, params: tuple = ()) -> None:
                nonlocal deleted
                deleted += c.execute(f"DELETE FROM {table} WHERE {cond}", params).rowcount

            for table in ("measurements", "transitions"):
                delete(table, "harness_version < ?", (harness_version,))
                if failures:
                    delete(table, "status != 'ok'")
                if older_than_days is not None:
                    delete(table, "created < ?", (time.time() - older_than_days * 86400.0,))
            for backend, version in current_versions.items():
                delete("measurements", "device = ? AND backend = ? AND backend_version != ?",
                       (device, backend, version))
                delete("transitions",
                       "device = ? AND ((src = ? AND src_version != ?) OR (dst = ? AND dst_version != ?))",
                       (device, backend, version, backend, version))
        with self._lock:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            self._conn.execute("VACUUM")
        return deleted

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> CostDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise CollageError(f"unknown measurement status '{status}'; expected one of {', '.join(STATUSES)}")


def _filters(**kw: Any) -> tuple[str, tuple]:
    given = {k: v for k, v in kw.items() if v is not None}
    if not given:
        return "", ()
    return " WHERE " + " AND ".join(f"{k} = ?" for k in given), tuple(given.values())


def _insert(c: sqlite3.Connection, table: str, cols: tuple[str, ...], row: dict[str, Any]) -> None:
    c.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
              tuple(row[k] for k in cols))


# -- export format ----------------------------------------------------------------------------------

# Strict JSON has no inf/nan (an error can be infinite); they travel as these strings.
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (base type, may be None), from the dataclass's (string) annotations."""
    out = {}
    for f in fields(cls):
        parts = str(f.type).split(" | ")
        out[f.name] = ({"str": str, "Status": str, "int": int, "float": float}[parts[0]], "None" in parts)
    return out


def _required(f: Field) -> bool:
    # `created` has a factory for new rows, but an imported row without it could not be merged by age.
    return f.name == "created" or (f.default is MISSING and f.default_factory is MISSING)


def _check_row(raw: Any, cls: type, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    types = _field_types(cls)
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise ValueError(f"{where}: unknown field '{unknown[0]}'")
    row: dict[str, Any] = {}
    for f in fields(cls):
        base, optional = types[f.name]
        if f.name not in raw:
            if _required(f):
                raise ValueError(f"{where}: missing field '{f.name}'")
            value = f.default
        elif (value := raw[f.name]) is None:
            if not optional:
                raise ValueError(f"{where}: field '{f.name}' must not be null")
        elif base is float and isinstance(value, str) and value in _NONFINITE:
            value = _NONFINITE[value]
        elif base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, base) or isinstance(value, bool):
            kind = "a number" if base is float else "an integer" if base is int else "a string"
            raise ValueError(f"{where}: field '{f.name}' must be {kind}, got {json.dumps(value)[:40]}")
        row[f.name] = value
    if row["status"] not in STATUSES:
        raise ValueError(f"{where}: unknown status '{row['status']}' (expected one of {', '.join(STATUSES)})")
    return row


def _read_export(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CollageError("no such file", where=str(path)) from None
    except OSError as exc:
        raise CollageError(f"cannot read: {exc.strerror or exc}", where=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CollageError(f"not valid JSON: {exc}", where=str(path)) from None
    try:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a collage cost export (expected \"format\": \"{FORMAT}\")")
        if doc.get("version") != EXPORT_VERSION:
            raise ValueError(f"export version {doc.get('version')!r}, this collage reads version {EXPORT_VERSION}")
        lists = {}
        for name in ("devices", "measurements", "transitions"):
            value = doc.get(name, [])
            if not isinstance(value, list):
                raise ValueError(f"'{name}' must be a list")
            lists[name] = value
        ms = [_check_row(r, Measurement, f"measurements[{i}]") for i, r in enumerate(lists["measurements"])]
        ts = [_check_row(r, Transition, f"transitions[{i}]") for i, r in enumerate(lists["transitions"])]
        for i, d in enumerate(lists["devices"]):
            if not (isinstance(d, dict) and isinstance(d.get("fingerprint"), str)
                    and isinstance(d.get("description"), str)):
                raise ValueError(f"devices[{i}]: expected {{\"fingerprint\": str, \"description\": str}}")
    except ValueError as exc:
        raise CollageError(str(exc), where=str(path)) from None
    return ms, ts, lists["devices"]
