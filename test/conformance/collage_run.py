"""Run one IREE e2e conformance file through collage with several plans and compare with IREE alone.

    python test/conformance/collage_run.py FILE [--plans default,random:0,random:1] [--json]
    python test/conformance/collage_run.py --all [--md OUT]     # sweep, one process per file, summary

For every plan: ``collage_mlir.artifact.compile_module`` builds the artifact, ``collage_runtime``
loads it with the Python ``check`` module, and every zero-argument function runs. A function passes
when its checks pass (check files) or when its printed outputs equal IREE alone's (FileCheck files).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from baseline import _JSON_MARK, CONFORMANCE, _kind, _rel, emit, example_inputs, run_file, run_functions  # noqa: E402
from check_module import CheckLog, create_check_module  # noqa: E402

DEFAULT_PLANS = ("default", "random:0", "random:1")


def run_with_plan(path: Path, plan: str, kind: str, inputs: dict | None = None) -> dict:
    """``{"compiled", "error", "regions": {backend: count}, "functions": {...}}`` for one plan (``inputs``:
    the file's ``example_inputs``, when the caller has them already)."""
    import collage_runtime
    from collage_mlir.iree import compile_module
    from collage_mlir.errors import CollageError
    from collage_mlir.ir import load_module, new_context

    rec: dict = {"compiled": False, "error": None, "regions": {}, "functions": {}}
    with tempfile.TemporaryDirectory() as out:
        try:
            result = compile_module(load_module(path, new_context()), plan, out)
        except CollageError as exc:
            rec["error"] = str(exc)
            return rec
        rec["compiled"] = True
        for r in result.plan.regions:
            rec["regions"][r.backend] = rec["regions"].get(r.backend, 0) + 1
        log = CheckLog()
        prog = collage_runtime.load(out, extra_modules=[lambda device: create_check_module(device, log)])
        try:
            rec["functions"] = run_functions(prog.vm_module, lambda name, args: prog.invoke(name, *args), log, kind,
                                             example_inputs(path) if inputs is None else inputs)
        finally:
            prog.close()
    return rec


def _plan_key(path: Path, plan: str):
    """The key (``Plan.key``) of the plan ``plan`` resolves to on this file (None when it does not resolve)."""
    from collage_mlir.errors import CollageError
    from collage_mlir.graph import Graph
    from collage_mlir.ir import load_module, new_context
    from collage_mlir.passes.number_ops import NumberOpsPass
    from collage_mlir.search import resolve_plan

    try:
        module = load_module(path, new_context())
        NumberOpsPass().run(module)
        return resolve_plan(plan, Graph(module)).key
    except CollageError:
        return None


def run(path: str | Path, plans: tuple[str, ...] = DEFAULT_PLANS) -> dict:
    """IREE alone, then each plan; ``mismatches`` lists every function that passes alone but not with a plan."""
    path = Path(path)
    kind = _kind(path)
    base = run_file(path)
    res = {"file": _rel(path), "kind": kind, "baseline": base, "plans": {}, "mismatches": []}
    if not base["compiled"]:
        return res
    seen: dict = {}  # Plan.key -> record: random plans of tiny functions often coincide
    inputs = example_inputs(path)  # parsed once (a file of 50 functions took ~1 s a parse)
    for plan in plans:
        key = _plan_key(path, plan)
        rec = seen[key] if key in seen else run_with_plan(path, plan, kind, inputs)
        if key is not None:
            seen[key] = rec
        res["plans"][plan] = rec
        for name, ref in base["functions"].items():
            if ref["status"] != "pass":
                continue
            got = rec["functions"].get(name)
            if got is None or got["status"] != "pass":
                why = rec["error"] or (got or {}).get("message", "missing")
                res["mismatches"].append(f"{plan} {name}: {why}")
            elif (kind == "filecheck" or name in inputs) and got["outputs"] != ref["outputs"]:
                res["mismatches"].append(f"{plan} {name}: outputs {got['outputs']} != IREE alone {ref['outputs']}")
    return res


def run_subprocess(path: Path, plans: str) -> dict:
    """``run`` in a fresh interpreter, so a crash costs one file."""
    import subprocess

    try:
        proc = subprocess.run([sys.executable, __file__, str(path), "--plans", plans, "--json"], capture_output=True,
                              text=True, timeout=120 * len(plans.split(",")))
    except subprocess.TimeoutExpired as exc:
        return {"file": _rel(path), "kind": _kind(path), "baseline": {"compiled": None, "functions": {}}, "plans": {},
                "mismatches": [f"timed out after {exc.timeout:.0f} s"]}
    for line in proc.stdout.splitlines():
        if line.startswith(_JSON_MARK):
            return json.loads(line[len(_JSON_MARK):])
    tail = " / ".join(ln for ln in proc.stderr.splitlines() if "leaked" not in ln)[-400:]
    return {"file": _rel(path), "kind": _kind(path), "baseline": {"compiled": None, "functions": {}}, "plans": {},
            "mismatches": [f"crashed (rc={proc.returncode}): {tail}"]}


def sweep(plans: str, jobs: int = 1) -> str:
    """Runs every conformance file (``jobs`` at a time); returns a markdown summary (counts per plan,
    regions per backend)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda p: run_subprocess(p, plans), sorted(CONFORMANCE.rglob("*.mlir"))))
    names = plans.split(",")
    alone = sum(1 for r in results for f in r["baseline"]["functions"].values() if f["status"] == "pass")
    lines = [f"Command: `python test/conformance/collage_run.py --all --plans {plans}`", "",
             f"Files: {len(results)}; compiled by IREE alone: {sum(1 for r in results if r['baseline']['compiled'])}; "
             f"functions IREE alone passes: {alone}", "",
             "| plan | functions passing | mismatches vs IREE alone | regions placed (by backend) |", "|---|---|---|---|"]
    for plan in names:
        ok = sum(1 for r in results for f in r["plans"].get(plan, {}).get("functions", {}).values()
                 if f["status"] == "pass")
        bad = sum(1 for r in results for m in r["mismatches"] if m.startswith(plan + " "))
        regions: dict[str, int] = {}
        for r in results:
            for b, n in r["plans"].get(plan, {}).get("regions", {}).items():
                regions[b] = regions.get(b, 0) + n
        lines.append(f"| {plan} | {ok} | {bad} | {', '.join(f'{b}: {n}' for b, n in sorted(regions.items())) or '-'} |")
    problems = [f"- {r['file']}: {m}" for r in results for m in r["mismatches"]]
    return "\n".join(lines + ["", "Mismatches:" if problems else "No mismatches.", *problems]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--plans", default=",".join(DEFAULT_PLANS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--all", action="store_true", help="sweep every conformance file")
    ap.add_argument("--md", help="with --all: also write the summary here")
    ap.add_argument("--jobs", type=int, default=1, help="with --all: files run at the same time")
    args = ap.parse_args()
    if args.all:
        text = sweep(args.plans, args.jobs)
        print(text)
        if args.md:
            Path(args.md).write_text(text)
        return
    if not args.file:
        ap.error("give FILE or --all")
    emit(run(args.file, tuple(args.plans.split(","))), args.json)


if __name__ == "__main__":
    main()
