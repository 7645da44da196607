"""`collage measure MODEL.mlir --backends B1,B2,...`: measures every candidate of every backend into
the cost database, with progress (candidates done/total, cache hits, failures, elapsed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import backend_names, load_input_arrays, positive_float, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..measure.db import default_db_path

    m = sub.add_parser("measure", help="measure every candidate region of a model on backends into the cost DB")
    m.add_argument("model", help="StableHLO module (.mlir text or .mlirbc bytecode)")
    m.add_argument("--backends", required=True, help="comma-separated backend names (see `collage backends`)")
    m.add_argument("--db", default=None, help=f"cost database (default: $COLLAGE_DB or {default_db_path()})")
    m.add_argument("--input", action="append", default=[],
                   help="example input .npy for @main, once per argument in order (default: generated data)")
    m.add_argument("--jobs", type=positive_int, default=None, help="parallel candidate builds (default: CPU count)")
    m.add_argument("--budget", type=positive_float, default=1.0, help="timing budget per candidate in seconds (default 1)")
    m.add_argument("--spread", type=positive_float, default=0.02,
                   help="stop timing once the median's relative uncertainty is below this (default 0.02)")
    m.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds before a hung build or run is killed and recorded as a timeout (default 300)")
    m.add_argument("--no-transitions", action="store_true",
                   help="skip measuring the transition cost of each backend pair (cached in the DB once measured)")
    m.add_argument("--remeasure", action="store_true", help="measure again pairs the database already holds")
    m.add_argument("--work-dir", help="keep region files, data and artifacts here (default: a temporary dir)")
    m.add_argument("--no-import-check", action="store_true",
                   help="do not check an imported model (.onnx) against its source on the inputs")
    m.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="build and time on the Ray cluster at ADDRESS (host:port, ray://host:port, auto): its nodes "
                        "of this machine's kind (see docs/measurement.md); the cost DB stays here")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)

    from ..backends import get_backend
    from ..graph import Graph, number_ops
    from ..ir import new_context
    from ..measure.cluster import connect
    from ..measure.db import CostDB, default_db_path
    from ..measure.harness import MeasureOptions, measure_regions
    from ..measure.import_check import load_checked
    from ..measure.timing import TimingOptions
    from ..search.candidates import enumerate_candidates

    if args.cluster:  # before any work: a missing Ray or an unreachable cluster is one line at once
        connect(args.cluster)
    names = backend_names(args.backends)
    backends = [get_backend(n, where="--backends") for n in names]
    arrays = load_input_arrays(args.input)
    examples = {"main": arrays} if arrays else {}
    module = load_checked(args.model, new_context(), arrays, check=not args.no_import_check)
    number_ops(module)
    candidates = enumerate_candidates(Graph(module), backends)
    options = MeasureOptions(timing=TimingOptions(budget_s=args.budget, rel_spread=args.spread),
                             build_timeout_s=args.timeout, run_timeout_s=args.timeout, remeasure=args.remeasure,
                             work_dir=Path(args.work_dir) if args.work_dir else None, cluster=args.cluster)
    if args.jobs:
        options.jobs = args.jobs
    console = Console(stderr=True)
    with CostDB(args.db or default_db_path()) as db, Progress(
            SpinnerColumn(), TextColumn("[bold]measure"), BarColumn(), MofNCompleteColumn(),
            TextColumn("hits {task.fields[hits]}  failures {task.fields[failures]}"), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=console, transient=False) as bar:
        task = bar.add_task("", total=None, hits=0, failures=0)

        def show(p) -> None:
            bar.update(task, total=p.total, completed=p.done, hits=p.cache_hits, failures=p.failures,
                       description=p.current)

        summary = measure_regions(module, [c.key for c in candidates], db, examples=examples,
                                  options=options, on_progress=show)
        bar.update(task, description="done")
        transitions = []
        if not args.no_transitions:
            from ..measure.transitions import measure_transitions

            pairs = bar.add_task("transitions", total=len(backends) ** 2, hits=0, failures=0)
            transitions = measure_transitions(backends, db, options,
                                              on_progress=lambda k, n: bar.update(pairs, completed=k, total=n))
    _print_summary(summary, names, Path(db.path))
    if transitions:
        _print_transitions(transitions)
    return 0


def _print_transitions(transitions) -> None:
    from rich.console import Console
    from rich.table import Table

    names = list(dict.fromkeys(t.src for t in transitions))
    cost = {(t.src, t.dst): (f"{t.cost_s * 1e6:+.0f}" if t.usable else str(t.status)) for t in transitions}
    table = Table(title="transition cost per boundary, µs (row: from, column: to)")
    table.add_column("")
    for n in names:
        table.add_column(n, justify="right")
    for a in names:
        table.add_row(a, *[cost.get((a, b), "") for b in names])
    Console().print(table)


def _print_summary(summary, names: list[str], db_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..measure.db import STATUSES

    table = Table(title=f"measured {len(summary.rows)} candidates in {summary.elapsed_s:.1f} s "
                        f"({summary.cache_hits} cache hits)")
    table.add_column("backend")
    table.add_column("candidates", justify="right")
    for status in STATUSES:
        table.add_column(status, justify="right")
    table.add_column("not posed", justify="right")
    for name in names:
        mine = [m for region, m in summary.rows.items() if region.backend == name]
        counts = [sum(1 for m in mine if m.status == s) for s in STATUSES]
        table.add_row(name, str(len(mine)), *[str(c) if c else "" for c in counts],
                      str(sum(1 for region in summary.skipped if region.backend == name) or ""))
    Console().print(table)
    print(f"cost database: {db_path}")
