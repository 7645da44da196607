"""ONNX's backend node tests as a conformance corpus: each single-node model through collage under several
plans, compared with the outputs ONNX ships.

    python test/conformance/onnx_nodes.py --all [--plans default,prefer:ort,...] [--jobs 2] [--md OUT] [--json OUT]
    python test/conformance/onnx_nodes.py --cases test_abs,test_mod_mixed_sign_int16 [--plans ...]

Cases come from ``onnx.backend.test`` (built in memory, with inputs and expected outputs; ``--modules``
builds only those op modules' cases, which is fast). Each case is written to a directory (``model.onnx``,
inputs, expected outputs) and run in a child process, which does what ``collage compile model.onnx --input
... --plan P`` and ``collage run`` do: import (in a child of its own, so an importer crash is what `collage
compile` makes of it), the import check against the source on the case's inputs,
then for each plan compile, load with ``collage_runtime`` and run. Each (case, plan) is classified:

    passed    exit 0 and the outputs equal ONNX's expected ones (dtype and shape; floats within the case's
              rtol/atol, 1e-3/1e-7 unless the case states otherwise; NaN where NaN is expected)
    refused   one error line (stage: import gap, check mismatch, compile/backend refusal, run error)
    wrong     exit 0 and other numbers than expected
    engine    exit 0, other numbers than expected, but ONNX Runtime alone gives them too (its own failure:
              ``test_dft``'s float32 sums), and collage equals it
    crashed   the child died (a signal) or hung past the timeout

A child that crashes costs the (case, plan) it was in; the rest go on in a new child. The rule
``test/python/conformance/test_onnx_nodes.py`` enforces: no (case, plan) is wrong or crashed, and every case that
passes under ``default`` passes under every plan, except entries of ``onnx_nodes_expected.json``.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "onnx_nodes_expected.json"
PLANS = ("default", "prefer:ort", "prefer:openvino", "random:0", "random:1", "random:2")
CLASSES = ("passed", "refused", "wrong", "engine", "crashed")
#: numpy's own numeric dtypes (ONNX's float8/float4/int4 types are extension dtypes .npy files cannot hold).
NUMERIC = {np.dtype(c) for c in "?bBhHiIlLqQefdFD"}
_MARK = "@@ONNX_NODE@@"


@dataclass(frozen=True)
class Row:
    """One (case, plan): its class, why (the error line, or what differs) and the regions it placed;
    ``ort``: ONNX Runtime's own class on the case (passed, wrong, refused; "" where not run)."""

    case: str
    plan: str
    klass: str
    reason: str = ""
    regions: dict = field(default_factory=dict)
    ort: str = ""


# --- cases ----------------------------------------------------------------------------------------------------


def node_cases(modules: Sequence[str] | None = None) -> dict:
    """ONNX's node test cases by name: all of them, or only those of ``modules`` (names under
    ``onnx.backend.test.case.node``, e.g. ``mod``: importing a module builds its cases)."""
    import importlib
    import warnings

    import onnx.backend.test.case.node as node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if modules is None:
            from onnx.backend.test.loader import load_model_tests

            return {c.name: c for c in load_model_tests(kind="node")}
        for m in modules:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    return {c.name: c for c in node._NodeTestCases}


def write_case(case, root: Path) -> Path | str:
    """Writes ``case`` to ``root/NAME`` (model.onnx, in_K.npy, want_K.npy, tolerance.json); a string (why)
    where it is not a model of plain tensors (sequences, optionals, strings)."""
    import onnx
    from onnx import numpy_helper

    def array(value):  # tensors come as arrays, numpy scalars or TensorProtos
        if isinstance(value, onnx.TensorProto):
            return numpy_helper.to_array(value)
        return np.asarray(value) if isinstance(value, np.generic) else value

    inputs, outputs = ([array(v) for v in values] for values in case.data_sets[0])
    odd = sorted({type(a).__name__ if not isinstance(a, np.ndarray) else str(a.dtype) for a in inputs + outputs
                  if not isinstance(a, np.ndarray) or a.dtype not in NUMERIC})
    if odd:  # sequences, optionals, strings; bfloat16/float8/float4, which have no numpy dtype in the runtime
        return f"not a model of numeric numpy tensors: {', '.join(odd)} values"
    d = root / case.name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(case.model, str(d / "model.onnx"))
    for k, a in enumerate(inputs):
        np.save(d / f"in_{k}.npy", a)
    for k, a in enumerate(outputs):
        np.save(d / f"want_{k}.npy", a)
    (d / "tolerance.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))
    return d


def _arrays(d: Path, prefix: str) -> list[np.ndarray]:
    return [np.load(d / f"{prefix}_{k}.npy") for k in range(len(list(d.glob(f"{prefix}_*.npy"))))]


# --- one case, in a child process -------------------------------------------------------------------------------


def _line(text: str) -> str:
    return " ".join(str(text).split())[:400]


def compare_expected(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float) -> str:
    """Empty when ``got`` equals ONNX's expected outputs as its backend tests compare them; else why not."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.dtype != w.dtype:
            return f"output {k}: dtype {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            return f"output {k}: shape {list(g.shape)}, expected {list(w.shape)}"
        try:
            if w.dtype.kind in "fc":
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
            else:
                np.testing.assert_array_equal(g, w)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith(("Mismatched", "Max abs"))]
            return f"output {k}: {'; '.join(lines) or _line(exc)}"
    return ""


def onnxruntime_verdict(model: Path, inputs: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: dict
                        ) -> tuple[str, list[np.ndarray] | None]:
    """ONNX Runtime's class on the case (passed, wrong, or refused where it cannot load or run it) and
    its outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        got = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)})
    except Exception:  # noqa: BLE001  (ORT's own exception types)
        return "refused", None
    return ("wrong" if compare_expected(got, want, tol["rtol"], tol["atol"]) else "passed"), got


def run_case(d: Path, plans: Sequence[str], emit) -> None:
    """Runs case directory ``d`` under ``plans`` and calls ``emit(Row)`` per plan (in ``plans`` order)."""
    import collage_runtime
    from collage_runtime.program import ArtifactError, InputError, RegionFailure

    from collage_mlir.errors import CollageError
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.measure.import_check import checked
    from collage_mlir.plan import PlanKey
    from collage_mlir.search import resolve_plan

    name = d.name
    inputs, want = _arrays(d, "in"), _arrays(d, "want")
    tol = json.loads((d / "tolerance.json").read_text())
    model = d / "model.onnx"
    ort_class, ort_out = onnxruntime_verdict(model, inputs, want, tol)
    emit = partial(_with_ort, emit, ort_class)
    try:
        module = load_model(model, new_context())  # as `collage compile`: a crash of the importer is kept apart
    except CollageError as exc:
        for plan in plans:
            emit(Row(name, plan, "refused", f"import: {_line(str(exc).removeprefix(f'{model}: '))}"))
        return
    try:
        module = checked(module, model, inputs, cache=False)  # a node computed wrong is kept as ONNX
    except CollageError as exc:
        for plan in plans:
            emit(Row(name, plan, "refused", f"check: {_line(str(exc).removeprefix(f'{model}: '))}"))
        return
    print(_MARK + json.dumps({"checked": name}), flush=True)
    bytecode = module.operation.get_asm(binary=True)
    done: dict[PlanKey, Row] = {}  # Plan.key -> its row: random plans of one node often coincide
    for plan in plans:
        copy = parse_module(bytecode, new_context())
        number_ops(copy)
        try:
            resolved = resolve_plan(plan, Graph(copy))
        except CollageError as exc:
            emit(Row(name, plan, "refused", f"plan: {_line(exc)}"))
            continue
        key = resolved.key
        if key in done:
            emit(Row(name, plan, done[key].klass, done[key].reason, done[key].regions))
            continue
        regions = dict(Counter(r.backend for r in resolved.regions))
        with tempfile.TemporaryDirectory(prefix="collage-onnx-node-") as out:
            try:
                compile_module(copy, resolved, Path(out) / "a", source=str(model))
            except CollageError as exc:
                row = Row(name, plan, "refused", f"compile: {_line(exc)}", regions)
            else:
                try:
                    with collage_runtime.load(Path(out) / "a") as prog:
                        got = [np.array(a) for a in prog.invoke("main", *inputs)]
                except (ArtifactError, InputError, RegionFailure, RuntimeError, ValueError) as exc:
                    row = Row(name, plan, "refused", f"run: {_line(exc)}", regions)
                else:
                    why = compare_expected(got, want, tol["rtol"], tol["atol"])
                    klass = "wrong" if why else "passed"
                    if why and ort_class == "wrong" and not compare_expected(got, ort_out, tol["rtol"], tol["atol"]):
                        klass, why = "engine", f"as ONNX Runtime alone: {why}"
                    row = Row(name, plan, klass, why, regions)
        done[key] = row
        emit(row)


def _with_ort(emit, ort_class: str, row: Row) -> None:
    emit(replace(row, ort=ort_class))


def child_main(dirs: Sequence[Path], plans: Sequence[str]) -> None:
    """Runs each case directory under ``plans``: one JSON line per (case, plan), and a ``checked`` line
    once a case's import passed its check (so the parent knows where a crash happened)."""
    import gc

    def emit(row: Row) -> None:
        print(_MARK + json.dumps(asdict(row)), flush=True)

    for d in dirs:
        run_case(d, plans, emit)
        # What the cases imported (torch, torch-mlir, the engines) and what stays cached, out of the
        # collector's full passes: each program closed collects (~0.3 s with all that loaded; a fifth of
        # the child's time). Collected first: no garbage is frozen.
        gc.collect()
        gc.freeze()


# --- the parent ---------------------------------------------------------------------------------------------


def run_cases(dirs: Sequence[Path], plans: Sequence[str], timeout_s: float = 300.0, on_row=lambda row: None,
              batch: int = 20) -> list[Row]:
    """Runs case directories in child processes, ``batch`` cases per child; a child that crashes or hangs
    costs the (case, plan) it was in (every plan of the case when it was in the import or the check), and
    a new child goes on with the rest. Every (case, plan)'s Row."""
    rows: list[Row] = []

    def record(row: Row) -> None:
        rows.append(row)
        on_row(row)

    todo = deque((d, list(plans)) for d in dirs)
    while todo:
        items = [todo.popleft()]
        if items[0][1] == list(plans):  # a case with only some plans left runs alone, under those
            while todo and len(items) < batch:
                items.append(todo.popleft())
        out = _run_child([d for d, _ in items], items[0][1], timeout_s)
        for k, (d, ps) in enumerate(items):
            mine = out.rows.get(d.name, [])
            for row in mine:
                record(row)
            if len(mine) == len(ps):
                continue
            left = ps[len(mine):]  # the child stopped in this case
            if mine or d.name in out.checked:
                record(Row(d.name, left[0], "crashed", out.why))
                rest = [(d, left[1:])] if left[1:] else []
            else:
                for p in left:
                    record(Row(d.name, p, "crashed", out.why))
                rest = []
            todo.extendleft(reversed(rest + items[k + 1:]))
            break
    return rows


def run_parallel(dirs: Sequence[Path], plans: Sequence[str], jobs: int, timeout_s: float = 300.0,
                 on_row=lambda row: None) -> list[Row]:
    """``run_cases`` on ``jobs`` shares of ``dirs`` at the same time (``on_row`` is called from their
    threads)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        parts = pool.map(lambda k: run_cases(dirs[k::jobs], plans, timeout_s, on_row), range(jobs))
        return [r for part in parts for r in part]


@dataclass(frozen=True)
class _ChildResult:
    rows: dict
    checked: set
    why: str


def _run_child(dirs: Sequence[Path], plans: Sequence[str], timeout_s: float) -> _ChildResult:
    """Runs a child on ``dirs``, reading its rows as they come; kills it when no line came for
    ``timeout_s``."""
    argv = [sys.executable, "-X", "faulthandler", __file__, "--child", "--plans", ",".join(plans), *map(str, dirs)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    lines: queue.Queue = queue.Queue()
    errors: list[str] = []
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    rows: dict[str, list[Row]] = {}
    checked: set[str] = set()
    timed_out = False
    while True:
        try:
            line = lines.get(timeout=timeout_s)
        except queue.Empty:
            proc.kill()
            timed_out = True
            break
        if line is None:
            break
        if line.startswith(_MARK):
            data = json.loads(line[len(_MARK):])
            if "checked" in data:
                checked.add(data["checked"])
            elif "case" in data:
                rows.setdefault(data["case"], []).append(Row(**data))
    code = proc.wait()
    if timed_out:
        return _ChildResult(rows, checked, f"timed out (no result for {timeout_s:.0f} s)")
    said = [ln.strip() for ln in errors if any(w in ln for w in ("Fatal Python error", "Assert", "rror:", "Abort"))]
    tail = " / ".join(said[:2] or [ln.strip() for ln in errors if ln.strip()][-1:])[:300]
    return _ChildResult(rows, checked, f"the child died (rc={code}): {tail}")


def prepare(names: Iterable[str] | None, modules: Sequence[str] | None, root: Path) -> tuple[list[Path], list[Row], dict]:
    """Writes the cases (``names``, or all of ``modules``' / ONNX's, in a seeded shuffle so that a run cut
    short is a sample spread over op types) under ``root``: their directories, refused rows for cases
    that are no tensor models, and every case's tolerances."""
    import random

    cases = node_cases(modules)
    wanted = list(names) if names is not None else random.Random(0).sample(sorted(cases), len(cases))
    missing = [n for n in wanted if n not in cases]
    if missing:
        raise SystemExit(f"unknown ONNX node cases: {', '.join(missing)}")
    dirs, rows = [], []
    for n in wanted:
        d = write_case(cases[n], root)
        if isinstance(d, str):
            rows.append(Row(n, "*", "refused", f"inputs: {d}"))
        else:
            dirs.append(d)
    return dirs, rows, {n: (cases[n].rtol, cases[n].atol) for n in wanted}


def expand(rows: list[Row], plans: Sequence[str]) -> list[Row]:
    """Rows of plan ``*`` (a case refused before any plan) as one row per plan."""
    return [Row(r.case, p, r.klass, r.reason) for r in rows for p in (plans if r.plan == "*" else [r.plan])]


# --- the rule ------------------------------------------------------------------------------------------------


def resumed(path: Path, plans: Sequence[str]) -> dict[str, list[Row]]:
    """The cases of an earlier run's rows that have a row for every plan and none wrong or crashed."""
    by_case: dict[str, list[Row]] = {}
    for line in path.read_text().splitlines():
        row = Row(**json.loads(line))
        by_case.setdefault(row.case, []).append(row)
    return {case: rs for case, rs in by_case.items()
            if {r.plan for r in rs} >= set(plans) and not any(r.klass in ("wrong", "crashed") for r in rs)}


def load_expected(path: Path = EXPECTED) -> dict:
    """``{case: {"plans": {plan or "*": class}, "reason": ...}}`` from the expected-failure file."""
    return json.loads(path.read_text())["expected"]


def violations(rows: Sequence[Row], expected: dict) -> list[str]:
    """What breaks the rule (module docstring), one line each; an expected entry whose case now behaves
    otherwise is one too (the list stays true)."""
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault(r.case, {})[r.plan] = r
    out = []
    for case, plans in sorted(by_case.items()):
        default = plans.get("default")
        bad = {p: r for p, r in plans.items()
               if r.klass in ("wrong", "crashed") or (default is not None and default.klass == "passed" and r.klass != "passed")}
        allowed = expected.get(case, {}).get("plans", {})  # plan -> class; "*": every plan
        for p, r in sorted(bad.items()):
            if allowed.get(p, allowed.get("*")) != r.klass:
                out.append(f"{case} under {p}: {r.klass}: {r.reason}")
        for p in sorted(plans if "*" in allowed else set(allowed) & set(plans)):
            if p not in bad:
                klass = allowed.get(p, allowed.get("*"))
                out.append(f"{case} under {p}: expected {klass} (onnx_nodes_expected.json) but {plans[p].klass}")
    return out


def summary(rows: Sequence[Row], plans: Sequence[str]) -> str:
    """A markdown table: per plan, (case, plan) rows by class, and every row that breaks the rule."""
    lines = ["| plan | " + " | ".join(CLASSES) + " | passes under default, not here | ONNX Runtime passes, not here |",
             "|---" * (len(CLASSES) + 3) + "|"]
    default = {r.case: r.klass for r in rows if r.plan == "default"}
    for p in plans:
        mine = [r for r in rows if r.plan == p]
        count = Counter(r.klass for r in mine)
        lost = sum(1 for r in mine if default.get(r.case) == "passed" and r.klass != "passed")
        behind = sum(1 for r in mine if r.ort == "passed" and r.klass != "passed")
        lines.append(f"| {p} | " + " | ".join(str(count.get(k, 0)) for k in CLASSES) + f" | {lost} | {behind} |")
    ort = Counter(r.ort for r in rows if r.plan == plans[0] and r.ort)
    lines += ["", f"ONNX Runtime alone on the same cases: " + ", ".join(f"{k} {v}" for k, v in sorted(ort.items()))]
    refused = Counter(r.reason.split(":", 1)[0] for r in rows if r.plan == "default" and r.klass == "refused")
    lines += ["", "Refused under default, by stage: " + ", ".join(f"{k} {v}" for k, v in refused.most_common())]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", help="(--child) case directories")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--all", action="store_true", help="every ONNX node case")
    ap.add_argument("--cases", help="comma-separated case names")
    ap.add_argument("--modules", help="comma-separated op modules whose cases to build (default: all)")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--jobs", type=int, default=1, help="child processes at the same time")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds without a result before a child is killed")
    ap.add_argument("--json", help="write every row here (JSON lines, appended as they come)")
    ap.add_argument("--md", help="write the summary table here")
    ap.add_argument("--resume", help="rows (JSON lines) of an earlier run: its cases with no wrong or crashed row "
                                     "are taken as they are, not run again")
    args = ap.parse_args()
    plans = args.plans.split(",")
    if args.child:
        child_main([Path(d) for d in args.dirs], plans)
        return
    if not args.all and not args.cases:
        ap.error("give --all or --cases")
    with tempfile.TemporaryDirectory(prefix="collage-onnx-nodes-") as work:
        names = args.cases.split(",") if args.cases else None
        dirs, rows, _ = prepare(names, args.modules.split(",") if args.modules else None, Path(work))
        rows = expand(rows, plans)
        if args.resume:
            done = resumed(Path(args.resume), plans)
            dirs = [d for d in dirs if d.name not in done]
            rows += [r for case in done.values() for r in case if r.case not in {x.case for x in rows}]
        sink = open(args.json, "a") if args.json else None
        lock = threading.Lock()

        def on_row(row: Row) -> None:
            with lock:
                if sink:
                    sink.write(json.dumps(asdict(row)) + "\n")
                    sink.flush()
                print(f"{row.case:50} {row.plan:16} {row.klass:8} {row.reason[:150]}", flush=True)

        for r in rows:
            on_row(r)
        started = time.time()
        rows += run_parallel(dirs, plans, args.jobs, args.timeout, on_row)
        if sink:
            sink.close()
    text = summary(rows, plans) + f"\n{len({r.case for r in rows})} cases, {time.time() - started:.0f} s\n"
    problems = violations(rows, load_expected() if EXPECTED.is_file() else {})
    text += "\n" + ("\n".join(["Breaking the rule:"] + [f"- {p}" for p in problems]) if problems else "No rule broken.") + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
