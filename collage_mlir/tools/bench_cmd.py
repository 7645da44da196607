"""`collage bench MODEL... [--plan PLAN] --vs torch,torch-compile,ort,openvino,iree,iree-dt,xla`: the
collage-compiled zoo models side by side with what a user would pick instead, timed interleaved in one
run; writes OUT/NAME.json, .md and .png."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..bench.contenders import PEERS
    from ..zoo import MODELS

    b = sub.add_parser("bench", help="benchmark zoo models compiled by collage against other engines",
                       epilog=f"models: {', '.join(MODELS)}")
    b.add_argument("models", nargs="*", metavar="MODEL", help="zoo model names (see below)")
    b.add_argument("--merge", nargs="+", metavar="RESULT.json",
                   help="no run: write one report (table, chart, geomean) of the models of earlier results")
    b.add_argument("--small", action="store_true", help="the models' small (CI) variants")
    b.add_argument("--plan", default="default",
                   help="the collage contender's plan: default | prefer:B1,B2 | random:SEED | whole:BACKEND (the whole "
                        "model as one region) | PLAN.json (a JSON plan is for one model)")
    b.add_argument("--tune", metavar="BUDGET", default=None,
                   help="tune each model first (`collage tune` on every available backend, and the bf16 ones for a "
                        "bf16 model, with this budget: 90s, 10m; the default cost DB) and bench the tuned plan, "
                        "written to OUT/NAME_MODEL.plan.json")
    b.add_argument("--vs", default=",".join(PEERS), help=f"comma-separated peers (default: {','.join(PEERS)})")
    b.add_argument("--threads", type=int, default=2, help="threads of every contender (default 2)")
    b.add_argument("--seconds", type=float, default=20.0,
                   help="seconds of interleaved timing per model, all contenders together (default 20)")
    b.add_argument("--rtol", type=float, default=1e-3,
                   help="tolerance against the reference (PyTorch eager; jax.jit for JAX models), relative to each output's largest |value| (default 1e-3)")
    b.add_argument("--breakdown-repeats", type=int, default=20,
                   help="after the timing, runs of the collage artifact with the region timer on, for the breakdown "
                        "of its time per region (0: none; default 20)")
    b.add_argument("-o", "--output", default="collage-bench",
                   help="directory for the results (default: collage-bench in the current directory)")
    b.add_argument("--name", default="bench", help="result file name stem (default: bench)")


def run(args: argparse.Namespace) -> int:
    from ..bench import report
    from ..bench.contenders import COLLAGE
    from ..bench.session import BenchOptions, run_bench
    from ..errors import CollageError

    if args.merge:
        return _merge(args)
    if not args.models:
        raise CollageError("name at least one zoo model (or --merge earlier results)")
    peers = [n.strip() for n in args.vs.split(",") if n.strip()]
    if args.threads < 1:
        raise CollageError(f"--threads must be at least 1, got {args.threads}")
    if len(args.models) > 1 and args.plan.endswith(".json"):
        raise CollageError("a JSON plan names op ids of one model: bench one model with it", where="--plan")
    if args.tune and args.plan != "default":
        raise CollageError("--tune and --plan both choose the collage contender's plan: give one", where="--tune")
    plans = _tune(args) if args.tune else {}
    options = BenchOptions(threads=args.threads, seconds=args.seconds, rtol=args.rtol,
                           plan=f"tuned, --tune {args.tune}" if args.tune else args.plan,
                           small=args.small, breakdown_repeats=args.breakdown_repeats)
    # The command line as given (`collage bench ...` or `python -m collage_mlir.tools.cli bench ...`).
    command = "collage " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["bench"] \
        else "collage bench " + " ".join(shlex.quote(a) for a in args.models)
    with tempfile.TemporaryDirectory(prefix="collage-bench-") as work:
        result = run_bench(args.models, [COLLAGE, *dict.fromkeys(p for p in peers if p != COLLAGE)], options, work,
                           log=lambda line: print(line, file=sys.stderr, flush=True), plans=plans,
                           on_model=lambda partial: report.write(partial, args.output, args.name, command))
    paths = report.write(result, args.output, args.name, command)
    print(report.to_markdown(result, command))
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def _tune(args: argparse.Namespace) -> dict[str, str]:
    """Tunes each model (`collage tune`'s search, its progress display) before any contender starts;
    returns model → the tuned plan document's path."""
    import json

    from .. import zoo
    from ..ir import new_context
    from ..search import tune_backends
    from . import tune_cmd

    budget = tune_cmd.parse_budget(args.tune)
    available = tune_cmd.parse_backends(None)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    plans = {}
    for m in args.models:
        module = zoo.import_stablehlo(m, new_context(), args.small)
        backends = tune_backends(module, available, None)  # the model's own precision: bf16 for a bf16 model
        result = tune_cmd.tune_model(module, {"main": zoo.numpy_inputs(m, args.small)}, backends, budget, 0, None)
        path = out / f"{args.name}_{m}.plan.json"
        path.write_text(json.dumps(result.tuned.to_json(), indent=1) + "\n")
        tune_cmd.print_summary(result, str(path))
        plans[m] = str(path)
    return plans


def _merge(args: argparse.Namespace) -> int:
    import json

    from ..bench import report
    from ..errors import CollageError

    docs = []
    for path in args.merge:
        try:
            docs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise CollageError(f"cannot read bench result: {exc}", where=path) from None
    result = report.merge(docs)
    command = "; ".join(d["command"] for d in docs)
    paths = report.write(result, args.output, args.name, command)
    print(report.to_markdown(result, command))
    print("wrote " + ", ".join(map(str, paths)))
    return 0
