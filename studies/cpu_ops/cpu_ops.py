"""Per-operator study: each distinct convolution of ResNet-50, ResNeXt-50 32x4d and MobileNetV2 and each
matmul of BERT-base (seq 128), timed on every available CPU backend through a compiled collage artifact
(so the time includes the backend's region boundary, as a plan would pay it). 2 threads everywhere (the
machine has 2 cores). Outputs are checked against iree-cpu.

    python -m studies.cpu_ops.cpu_ops [--models resnet50,...] [--backends ...] [--out studies/cpu_ops/cpu_ops]

Writes OUT.json (every timing) and OUT.md (the table: winner per op, best/worst ratio).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress

from studies.cpu_ops.model_zoo_ops import MODELS, Conv, Matmul, unique  # noqa: E402

import collage_runtime  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.errors import CollageError  # noqa: E402
from collage_mlir.ir import new_context, parse_module  # noqa: E402
from collage_mlir.search import available_backends  # noqa: E402


def _t(shape) -> str:
    return "tensor<" + "x".join(map(str, shape)) + "xf32>"


def op_function(op: Conv | Matmul) -> tuple[str, list[tuple[int, ...]]]:
    """StableHLO text of a function running only ``op`` (weights are arguments), and its argument shapes."""
    if isinstance(op, Conv):
        p = op.k // 2
        out = (op.hw + 2 * p - op.k) // op.stride + 1
        x, w, y = (1, op.cin, op.hw, op.hw), (op.cout, op.cin // op.groups, op.k, op.k), (1, op.cout, out, out)
        body = (f"%0 = stablehlo.convolution(%a, %b) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], "
                f"window = {{stride = [{op.stride}, {op.stride}], pad = [[{p}, {p}], [{p}, {p}]], "
                f"rhs_dilate = [1, 1]}} {{batch_group_count = 1 : i64, feature_group_count = {op.groups} : i64}}"
                f" : ({_t(x)}, {_t(w)}) -> {_t(y)}")
        shapes = [x, w]
    else:
        lead = (op.batch,) if op.batch > 1 else ()
        x, w, y = lead + (op.m, op.k), lead + (op.k, op.n), lead + (op.m, op.n)
        batch = "batching_dims = [0] x [0], contracting_dims = [2] x [1]" if lead else "contracting_dims = [1] x [0]"
        body = f"%0 = stablehlo.dot_general %a, %b, {batch} : ({_t(x)}, {_t(w)}) -> {_t(y)}"
        shapes = [x, w]
    text = (f"func.func @{op.name}(%a: {_t(shapes[0])}, %b: {_t(shapes[1])}) -> {_t(y)} {{\n  {body}\n"
            f"  return %0 : {_t(y)}\n}}\n")
    return text, shapes


def time_call(fn, args, budget_s: float = 0.4, max_reps: int = 200) -> dict:
    """Median of repeated calls after warm-up, until ``budget_s`` is spent (at least 5 calls)."""
    for _ in range(2):
        fn(*args)
    samples = []
    start = time.perf_counter()
    while len(samples) < 5 or (time.perf_counter() - start < budget_s and len(samples) < max_reps):
        t0 = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3, "reps": len(samples)}


def run(models: list[str], backends: list[str], out: Path) -> list[dict]:
    console = Console()
    rows: list[dict] = []
    rng = np.random.default_rng(0)
    for model in models:
        ops = unique(MODELS[model]())
        funcs = [op_function(op) for op in ops]
        text = "".join(f for f, _ in funcs)
        args = {op.name: [rng.standard_normal(s).astype(np.float32) for s in shapes] for op, (_, shapes) in
                zip(ops, funcs)}
        reference: dict[str, np.ndarray] = {}
        for backend in ["iree-cpu"] + [b for b in backends if b != "iree-cpu"]:
            plan = "default" if backend == "iree-cpu" else f"prefer:{backend}"
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                try:
                    compile_module(parse_module(text, new_context()), plan, tmp)
                except CollageError as exc:
                    console.print(f"[red]{model} on {backend}: compile failed: {exc}")
                    continue
                compile_s = time.perf_counter() - t0
                with collage_runtime.load(tmp) as prog, Progress(console=console, transient=True) as bar:
                    task = bar.add_task(f"{model} on {backend}", total=len(ops))
                    for op in ops:
                        a = args[op.name]
                        y = prog.invoke(op.name, *a)[0]
                        if backend == "iree-cpu":
                            reference[op.name] = y
                        err = float(np.max(np.abs(y - reference[op.name]) / (1 + np.abs(reference[op.name]))))
                        fn = prog.device_function(op.name)
                        dev_args = [prog.to_device(v) for v in a]
                        timing = time_call(fn, dev_args)
                        rows.append({"model": model, "op": op.name, "backend": backend, "gflop": op.flops / 1e9,
                                     "max_scaled_err": err, "compile_s": compile_s, **timing})
                        bar.advance(task)
            console.print(f"{model} on {backend}: {len(ops)} ops, compile {compile_s:.1f}s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(markdown(rows, backends))
    return rows


def markdown(rows: list[dict], backends: list[str]) -> str:
    """Table per op: ms on each backend, the winner, best/worst ratio; then wins per backend."""
    by_op: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        by_op.setdefault((r["model"], r["op"]), {})[r["backend"]] = r
    cols = [b for b in backends if any(b in v for v in by_op.values())]
    lines = ["| model | op | GFLOP | " + " | ".join(f"{b} ms" for b in cols) + " | winner | worst/best |",
             "|---|---|---:|" + "---:|" * len(cols) + "---|---:|"]
    wins: dict[str, int] = {b: 0 for b in cols}
    for (model, op), per in by_op.items():
        ok = {b: r for b, r in per.items() if r["max_scaled_err"] < 1e-3}
        best = min(ok, key=lambda b: ok[b]["median_ms"])
        worst = max(ok, key=lambda b: ok[b]["median_ms"])
        wins[best] += 1
        cells = []
        for b in cols:
            r = per.get(b)
            if r is None:
                cells.append("–")
            elif b not in ok:
                cells.append(f"wrong ({r['max_scaled_err']:.1e})")
            else:
                cells.append(("**%.3f**" if b == best else "%.3f") % r["median_ms"])
        gflop = next(iter(per.values()))["gflop"]
        lines.append(f"| {model} | {op} | {gflop:.3f} | " + " | ".join(cells) +
                     f" | {best} | {ok[worst]['median_ms'] / ok[best]['median_ms']:.1f}x |")
    lines += ["", "Wins per backend: " + ", ".join(f"{b} {n}" for b, n in sorted(wins.items(), key=lambda x: -x[1]))]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--backends", default=",".join(b.name for b in available_backends()))
    p.add_argument("--out", default=str(Path(__file__).parent / "cpu_ops"))
    a = p.parse_args()
    run(a.models.split(","), a.backends.split(","), Path(a.out))
    print(Path(a.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
