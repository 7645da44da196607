"""``collage db``: inspect and maintain the cost database.

    collage db stats [--db PATH]
    collage db export FILE.json [--db PATH]
    collage db import FILE.json [--db PATH]
    collage db prune [--failures] [--older-than DAYS] [--db PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import CollageError
from ..measure.db import STATUSES, CostDB, default_db_path
from . import nonnegative_float


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``db`` and its subcommands to the ``collage`` parser."""
    from ..frontends import cache_dir

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", type=Path, default=None, metavar="PATH",
                        help=f"cost database (default: $COLLAGE_DB, else {cache_dir() / 'costs.sqlite'})")
    d = sub.add_parser("db", help="inspect and maintain the cost database")
    dsub = d.add_subparsers(dest="db_cmd", required=True, metavar="{stats,export,import,prune}")
    dsub.add_parser("stats", parents=[common], help="rows by backend and status, devices, file size")
    e = dsub.add_parser("export", parents=[common], help="write every row to a JSON file")
    e.add_argument("file", type=Path, metavar="FILE.json")
    i = dsub.add_parser("import", parents=[common],
                        help="merge a JSON export in (per key the newer measurement wins)")
    i.add_argument("file", type=Path, metavar="FILE.json")
    p = dsub.add_parser("prune", parents=[common],
                        help="delete rows of older harness versions and of this device's outdated backend versions")
    p.add_argument("--failures", action="store_true", help="also delete every failed measurement (to retry them)")
    p.add_argument("--older-than", type=nonnegative_float, metavar="DAYS", help="also delete rows older than DAYS")


def run(args: argparse.Namespace) -> int:
    """Runs a parsed ``collage db`` command; CollageError propagates to the caller's run_tool."""
    path = Path(args.db or default_db_path())
    if args.db_cmd != "import" and not path.is_file():
        # Reading commands never create a database: a mistyped --db is an error, not an empty DB.
        raise CollageError("no cost database here (check --db or $COLLAGE_DB; `collage measure` creates one)",
                           where=str(path))
    with CostDB(path) as db:
        if args.db_cmd == "stats":
            _print_stats(db.stats())
        elif args.db_cmd == "export":
            n = db.export_json(args.file)
            print(f"exported {n} rows from {db.path} to {args.file}")
        elif args.db_cmd == "import":
            written, skipped = db.import_json(args.file)
            print(f"imported {written} rows from {args.file} into {db.path} ({skipped} skipped: not newer)")
        elif args.db_cmd == "prune":
            n = _prune(db, args)
            print(f"pruned {n} rows from {db.path}")
        else:  # argparse rejects anything else; a new subcommand must be wired here
            raise AssertionError(args.db_cmd)
    return 0


def _prune(db: CostDB, args: argparse.Namespace) -> int:
    from ..backends import registry
    from ..measure import HARNESS_VERSION
    from ..measure.device import device_fingerprint

    # An unavailable backend's version is unknown here, so its rows stay (see CostDB.prune).
    versions = {name: info.backend.version() for name, info in registry().items()
                if info.backend is not None and not info.problem}
    return db.prune(harness_version=HARNESS_VERSION, current_versions=versions, device=device_fingerprint()[0],
                    failures=args.failures, older_than_days=args.older_than)


def _print_stats(stats: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    by_backend: dict[str, dict[str, int]] = stats["by_backend"]
    # Known statuses in their order, then any a newer collage wrote.
    statuses = list(STATUSES) + sorted({s for c in by_backend.values() for s in c} - set(STATUSES))
    table = Table(title="collage cost database")
    table.add_column("backend")
    for s in statuses:
        table.add_column(s, justify="right")
    table.add_column("total", justify="right")
    for backend, counts in sorted(by_backend.items()):
        table.add_row(escape(backend), *(str(counts.get(s, 0)) for s in statuses), str(sum(counts.values())))
    table.add_section()
    totals = [sum(c.get(s, 0) for c in by_backend.values()) for s in statuses]
    table.add_row("[bold]all", *(str(t) for t in totals), f"[bold]{stats['measurements']}")
    console = Console()
    console.print(table)
    console.print(f"transitions: {stats['transitions']}")
    devices = stats["devices"]
    console.print(f"devices: {len(devices)}")
    for d in devices:
        console.print(f"  {d['fingerprint']}  {escape(d['description'])}")
    console.print(f"size: {_human(stats['size_bytes'])}")
    console.print(f"path: {escape(stats['path'])}", soft_wrap=True)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
