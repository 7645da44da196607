"""Stress, concurrency and soak runs of programs that mix engines (ORT, OpenVINO, XLA, oneDNN) in one process.

    python -X faulthandler test/stress/mixed_engines.py stress [--calls 10000] [--plans 3] [--live 3] [--seed 0]
                                                        [--load-rate 0.03] [--unload-rate 0.02]
    python -X faulthandler test/stress/mixed_engines.py threads [--threads 4] [--calls 200] [--programs 1]
    python -X faulthandler test/stress/mixed_engines.py soak [--calls 100000] [--every 5000]
    python -X faulthandler test/stress/mixed_engines.py replay [--file models/fullyconnected.mlir] [--rounds 50]

``stress`` compiles small models (conformance files and test/python/models.py) under random plans whose
library/graph regions span at least two of those engines, then in one process loads and unloads those
programs (up to ``--live`` at once; unloaded by ``close()``, by ``with``, or by dropping the last
reference), interleaving calls (``invoke`` and ``invoke_dlpack``, several input sets per model). Every
call is checked: within the plan's backends' tolerance of IREE alone's result (the default plan), and
bit-identical to that program's first result for the same inputs (a reused or freed buffer shows there).
``threads`` calls one loaded mixed program from several threads at once; ``soak`` calls one many times,
sampling the resident set; ``replay`` repeats the conformance runner's own path (collage_run.run) in
one process. Each prints one JSON line (``--json``) or a summary, and exits 1 on a wrong
or failed call.

It lives beside the conformance runner, not in it: it draws its models from both the conformance corpus
and test/python/models.py, and runs one long process rather than one process per file. The pytest side
(test/python/runtime/test_stress.py, marker ``bench`` for the long runs) imports it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "conformance"))
sys.path.insert(0, str(HERE.parent / "python"))

#: The engines served through collage_rt that a stressed plan mixes.
ENGINES = frozenset({"ort", "openvino", "xla-cpu", "onednn"})

#: A small program whose explicit plan (``mixed_plan``) puts one region on each of ENGINES, with values
#: crossing between them, two results (one also read by a later region) and two inputs.
MIXED = """
func.func @main(%x: tensor<4x16xf32>, %y: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %w = stablehlo.constant dense<0.125> : tensor<16x16xf32>
  %b = stablehlo.constant dense<0.5> : tensor<4x16xf32>
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %1 = stablehlo.add %0, %b : tensor<4x16xf32>
  %2 = stablehlo.tanh %1 : tensor<4x16xf32>
  %3 = stablehlo.multiply %2, %y : tensor<4x16xf32>
  %4 = stablehlo.exponential %3 : tensor<4x16xf32>
  %5 = stablehlo.dot_general %4, %w, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %6 = stablehlo.subtract %5, %x : tensor<4x16xf32>
  %7 = stablehlo.logistic %6 : tensor<4x16xf32>
  %8 = stablehlo.add %7, %2 : tensor<4x16xf32>
  return %8, %4 : tensor<4x16xf32>, tensor<4x16xf32>
}
"""


def mixed_plan():
    """MIXED's plan: op ids as collage-number-ops gives them (0, 1: constants; 2 .. 10: the ops in order)."""
    from collage_mlir.plan import Plan, Region

    return Plan([Region("mm", "onednn", frozenset({2})), Region("act", "ort", frozenset({3, 4})),
                 Region("gate", "openvino", frozenset({5, 6})), Region("tail", "xla-cpu", frozenset({7, 8, 9}))],
                source="mixed")


@dataclass(frozen=True)
class Model:
    """A model to compile under several plans: its function, input sets, and a fresh module per compile."""

    name: str
    function: str
    inputs: tuple[tuple[np.ndarray, ...], ...]
    module: Callable[[], object] = field(repr=False)


@dataclass(frozen=True)
class Case:
    """One compiled program and what every call of it must return: within (rtol, atol) of ``expected``
    (IREE alone's results, per input set)."""

    model: str
    plan: str
    path: Path
    function: str
    inputs: tuple[tuple[np.ndarray, ...], ...]
    expected: tuple[tuple[np.ndarray, ...], ...]
    rtol: float
    atol: float
    regions: dict[str, int]


def _input_sets(shapes: list[tuple[int, ...]], seed: int, count: int = 3) -> tuple[tuple[np.ndarray, ...], ...]:
    rng = np.random.default_rng(seed)
    return tuple(tuple(rng.standard_normal(s).astype(np.float32) for s in shapes) for _ in range(count))


def mixed_model() -> Model:
    from collage_mlir.ir import new_context, parse_module

    return Model("mixed", "main", _input_sets([(4, 16), (4, 16)], 0), lambda: parse_module(MIXED, new_context()))


def models() -> list[Model]:
    """Conformance files with a function taking static f32 inputs (fullyconnected is the file a runner once
    crashed on), and test/python/models.py's small torch models (conv and matmul regions for oneDNN)."""
    from baseline import CONFORMANCE, example_inputs
    from collage_mlir.ir import load_module, new_context

    found = [mixed_model()]
    for rel in ("models/fullyconnected.mlir", "models/edge_detection.mlir"):
        path = CONFORMANCE / rel
        if path.exists():
            (function, args), = example_inputs(path).items()
            found.append(Model(path.stem, function, _input_sets([a.shape for a in args], len(found)),
                               lambda path=path: load_module(path, new_context())))
    try:
        import torch
    except ImportError:
        return found
    import models as zoo
    from collage_mlir.frontends.torch import import_torch

    for build, shape in ((zoo.mlp, (4, 32)), (zoo.branching, (3, 16)), (zoo.small_cnn, (1, 3, 16, 16)),
                         (zoo.lstm, (6, 2, 8))):
        sets = _input_sets([shape], len(found))
        found.append(Model(build.__name__, "main", sets, lambda build=build, x=torch.from_numpy(sets[0][0]):
                           import_torch(build(), [x], new_context())))
    return found


def tolerance(backends) -> tuple[float, float]:
    """The loosest (rtol, atol) of ``backends`` and iree-cpu."""
    from collage_mlir.backends import get_backend

    names = set(backends) | {"iree-cpu"}
    return max(get_backend(b).tolerance.rtol for b in names), max(get_backend(b).tolerance.atol for b in names)


def _run_once(path: Path, model: Model) -> tuple[tuple[np.ndarray, ...], ...]:
    import collage_runtime

    with collage_runtime.load(path) as prog:
        return tuple(tuple(np.array(r) for r in prog.invoke(model.function, *args)) for args in model.inputs)


def compile_case(model: Model, plan, out: Path, expected=None) -> Case:
    """Compiles ``model`` under ``plan`` (a plan string or Plan) into ``out``; ``expected`` defaults to the
    program's own results (for the default plan: IREE alone's)."""
    from collage_mlir.iree import compile_module

    result = compile_module(model.module(), plan, out)
    regions = dict(Counter(r.backend for r in result.plan.regions))
    rtol, atol = tolerance(regions)
    return Case(model.name, result.plan.source or str(plan), out, model.function, model.inputs,
                expected if expected is not None else _run_once(out, model), rtol, atol, regions)


def mixing_plans(model: Model, count: int, seed: int = 0, tries: int = 60) -> list:
    """Up to ``count`` distinct ``random:K`` plans (K from ``seed``) whose library/graph regions span at
    least two of ENGINES."""
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.search import resolve_plan

    module = model.module()
    number_ops(module)
    graph = Graph(module)
    chosen, seen = [], set()
    for k in range(seed, seed + tries):
        plan = resolve_plan(f"random:{k}", graph)
        key = plan.key
        if key not in seen and len({r.backend for r in plan.regions} & ENGINES) >= 2:
            seen.add(key)
            chosen.append(plan)
        if len(chosen) == count:
            break
    return chosen


def build(workdir: Path, plans: int, seed: int = 0, log=print) -> list[Case]:
    """For every model: IREE alone's results, then up to ``plans`` mixing plans compiled into ``workdir``."""
    cases = []
    for m in models():
        ref = compile_case(m, "default", workdir / f"{m.name}-default")
        for k, plan in enumerate(mixing_plans(m, plans, seed)):
            case = compile_case(m, plan, workdir / f"{m.name}-{k}", ref.expected)
            log(f"compiled {m.name} {case.plan}: {case.regions}")
            cases.append(case)
    return cases


def rss_kib() -> int:
    """The process's resident set (/proc/self/statm), KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class Checker:
    """Checks each call's results: within the case's tolerance of ``expected``, and bit-identical to the
    first result this process saw for the same case and input set. Keeps the first few problems."""

    def __init__(self, limit: int = 20):
        self.first: dict[tuple[Path, int], tuple[np.ndarray, ...]] = {}
        self.problems: list[str] = []
        self.limit = limit
        self._lock = threading.Lock()

    def __call__(self, case: Case, index: int, results) -> bool:
        got = tuple(np.array(r) for r in results)  # a copy: the results are views of IREE's buffers
        why = None
        if len(got) != len(case.expected[index]):
            why = f"{len(got)} results, expected {len(case.expected[index])}"
        else:
            for k, (g, e) in enumerate(zip(got, case.expected[index])):
                if g.shape != e.shape or not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                    why = f"result {k} differs from IREE alone by {_diff(g, e)} (rtol {case.rtol}, atol {case.atol})"
                    break
            with self._lock:
                first = self.first.setdefault((case.path, index), got)
            if why is None and any(not np.array_equal(g, f, equal_nan=True) for g, f in zip(got, first)):
                why = "differs from the program's first result for these inputs by " + \
                      ", ".join(_diff(g, f) for g, f in zip(got, first))
        if why is not None:
            self.fail(f"{case.model} {case.plan} input set {index}: {why}")
        return why is None

    def fail(self, message: str) -> None:
        with self._lock:
            if len(self.problems) < self.limit:
                self.problems.append(message)


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    return f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0)):.3g}"


def call(prog, case: Case, index: int, dlpack: bool):
    """One call of ``case``'s function on input set ``index``, through ``invoke`` or ``invoke_dlpack``."""
    if dlpack:
        return [np.from_dlpack(r) if hasattr(r, "__dlpack__") else r
                for r in prog.invoke_dlpack(case.function, *case.inputs[index])]
    return prog.invoke(case.function, *case.inputs[index])


def stress(cases: list[Case], calls: int, seed: int = 0, live: int = 3, load_rate: float = 0.03,
           unload_rate: float = 0.02, log=print) -> dict:
    """Loads, calls and unloads ``cases`` at random in this process until ``calls`` calls have run: per
    step, a load with probability ``load_rate`` (below ``live`` programs loaded; always when none is), an
    unload with ``unload_rate`` (``load_rate + unload_rate`` at ``live``), else a call. Each load picks a
    thread budget of 1, 2 or 4 (4: OpenVINO regions load on 4 threads at once, beside ORT and XLA loads)."""
    import collage_runtime

    rng = random.Random(seed)
    check = Checker()
    loaded: dict[int, object] = {}
    done, counts = 0, Counter()
    rss = [rss_kib()]
    while done < calls and not check.problems:
        r = rng.random()
        if not loaded or (r < load_rate and len(loaded) < min(live, len(cases))):
            k = rng.choice([k for k in range(len(cases)) if k not in loaded])
            threads = rng.choice((1, 2, 4))
            loaded[k] = collage_runtime.load(cases[k].path, threads=threads)
            counts["loads"] += 1
        elif r < load_rate + unload_rate:
            k = rng.choice(sorted(loaded))
            how = rng.choice(("close", "with", "drop"))
            prog = loaded.pop(k)
            if how == "close":
                prog.close()
            elif how == "with":
                with prog:
                    check(cases[k], 0, call(prog, cases[k], 0, False))
                done += 1
            del prog  # "drop": the last reference goes here, without close()
            counts[f"unloads by {how}"] += 1
        else:
            k = rng.choice(sorted(loaded))
            index = rng.randrange(len(cases[k].inputs))
            dlpack = rng.random() < 0.3
            try:
                check(cases[k], index, call(loaded[k], cases[k], index, dlpack))
            except Exception as exc:  # noqa: BLE001 - a failed call is a finding, reported with the case
                check.fail(f"{cases[k].model} {cases[k].plan}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            done += 1
            counts["invoke_dlpack" if dlpack else "invoke"] += 1
            if done % 1000 == 0:
                rss.append(rss_kib())
                log(f"{done} calls, {counts['loads']} loads, {len(loaded)} live, RSS {rss[-1] // 1024} MiB")
    for prog in loaded.values():
        prog.close()
    loaded.clear()
    gc.collect()
    return {"mode": "stress", "calls": done, "programs": len(cases), "counts": dict(counts),
            "rss_kib": rss, "problems": check.problems,
            "plans": [{"model": c.model, "plan": c.plan, "regions": c.regions} for c in cases]}


def threaded(case: Case, threads: int, calls: int, programs: int = 1, log=print) -> dict:
    """``threads`` Python threads call ``case`` ``calls`` times each, all at once: thread t calls the
    (t mod ``programs``)-th of ``programs`` loaded copies (1: every thread calls the same program)."""
    import collage_runtime

    check = Checker()
    progs = [collage_runtime.load(case.path) for _ in range(programs)]
    try:
        for index in range(len(case.inputs)):  # each input set's first result, from one thread
            check(case, index, call(progs[0], case, index, False))
        start = threading.Barrier(threads)

        def work(t: int) -> None:
            rng, prog = random.Random(t), progs[t % programs]
            start.wait()
            for _ in range(calls):
                index = rng.randrange(len(case.inputs))
                try:
                    check(case, index, call(prog, case, index, rng.random() < 0.3))
                except Exception as exc:  # noqa: BLE001 - reported
                    check.fail(f"thread {t}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        for prog in progs:
            prog.close()
    log(f"{threads} threads x {calls} calls on {programs} program(s): {len(check.problems)} problems")
    return {"mode": "threads", "threads": threads, "programs": programs, "calls": threads * calls,
            "regions": case.regions, "problems": check.problems}


def soak(case: Case, calls: int, every: int = 5000, log=print) -> dict:
    """``calls`` calls of one loaded program of ``case`` (input sets in turn, every result checked), the
    resident set sampled before the first call and every ``every`` calls."""
    import collage_runtime

    check = Checker()
    samples = [(0, rss_kib())]
    with collage_runtime.load(case.path) as prog:
        n = len(case.inputs)
        for k in range(calls):
            if not check(case, k % n, call(prog, case, k % n, k % 4 == 3)):
                break
            if (k + 1) % every == 0:
                samples.append((k + 1, rss_kib()))
                log(f"{k + 1} calls, RSS {samples[-1][1] / 1024:.1f} MiB")
    return {"mode": "soak", "calls": calls, "regions": case.regions, "rss_kib": samples, "problems": check.problems}


def replay(path: Path, rounds: int, seed: int = 0, log=print) -> dict:
    """The conformance runner's own path (collage_run.run), ``rounds`` times in this process on ``path``: IREE
    alone on a device of its own with the check module, then ``default`` and two new ``random:K`` plans,
    each compiled here, loaded with the check module, run and closed (the runner that crashed did this once
    per process)."""
    import collage_run

    problems, calls, regions = [], 0, Counter()
    for k in range(rounds):
        plans = ("default", f"random:{seed + 2 * k}", f"random:{seed + 2 * k + 1}")
        res = collage_run.run(path, plans)
        problems += [f"{path.name} {m}" for m in res["mismatches"]]
        calls += sum(len(p["functions"]) for p in res["plans"].values())
        for p in res["plans"].values():
            regions.update(p["regions"])
        log(f"round {k + 1}: {calls} calls, regions so far {dict(regions)}")
    return {"mode": "replay", "file": path.name, "rounds": rounds, "calls": calls, "regions": dict(regions),
            "problems": problems}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("stress", "threads", "soak", "replay"))
    ap.add_argument("--calls", type=int, help="stress: calls in all (10000); threads: per thread (200); "
                                               "soak: calls (100000)")
    ap.add_argument("--plans", type=int, default=3, help="stress: mixing plans per model")
    ap.add_argument("--live", type=int, default=3, help="stress: programs loaded at once, at most")
    ap.add_argument("--load-rate", type=float, default=0.03, help="stress: chance of a load per step")
    ap.add_argument("--unload-rate", type=float, default=0.02, help="stress: chance of an unload per step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4, help="threads: Python threads calling at once")
    ap.add_argument("--programs", type=int, default=1, help="threads: loaded copies the threads share")
    ap.add_argument("--every", type=int, default=5000, help="soak: calls between RSS samples")
    ap.add_argument("--file", default="models/fullyconnected.mlir", help="replay: conformance file")
    ap.add_argument("--rounds", type=int, default=50, help="replay: rounds of three plans")
    ap.add_argument("--workdir", help="where artifacts are compiled (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = ap.parse_args(argv)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        if args.mode == "replay":
            from baseline import CONFORMANCE

            report = replay(CONFORMANCE / args.file, args.rounds, args.seed, log)
        elif args.mode == "stress":
            report = stress(build(work, args.plans, args.seed, log), args.calls or 10000, args.seed, args.live,
                            args.load_rate, args.unload_rate, log)
        else:
            model = mixed_model()
            ref = compile_case(model, "default", work / "mixed-default")
            case = compile_case(model, mixed_plan(), work / "mixed", ref.expected)
            report = (threaded(case, args.threads, args.calls or 200, args.programs, log) if args.mode == "threads"
                      else soak(case, args.calls or 100000, args.every, log))
    print(json.dumps(report) if args.json else json.dumps(report, indent=1), flush=True)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
