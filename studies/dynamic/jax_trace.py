"""A JAX model served over a trace of request shapes: collage's buckets with IREE's dynamic program between
them, against the ways a JAX user serves it today.

The model is ``iree_fallback.py``'s transformer encoder (one sequence of a dynamic length ``s``, 8..256),
written with ``jax.nn``. The trace draws ``--requests`` lengths from a skewed distribution (most requests
short, a long tail), so most lengths occur once or twice. Each way serves the whole trace, timed end to end:

- **collage**: ``collage compile enc.mlir --dim s=8:64:256 --shapes trace.json`` (the jax.export module;
  buckets chosen for the trace, between them the fastest engine that takes the module with its dynamic
  dims), compiled ahead: nothing compiles at request time. With ``--tune SECONDS`` the buckets chosen are
  then tuned (``collage tune --dim ... --bucket ...``, a cost DB of the study's own) and compiled again
  with their tuned plans (``--plan tuned``), as a user who tunes does. Compile and tune times are reported
  apart;
- **jax.jit**: compiles each length on its first request (counted: that is what serving it costs), and
  again with every length already compiled (steady);
- **ort** / **openvino**: the model exported to ONNX with the dynamic axis by jax2onnx (how a JAX user reaches
  those engines), run with its dynamic dim.

Results are checked against jax's on every request of the first pass. Writes ``jax_trace.json``/``.md``
beside this file (or ``--out``):

    python -m studies.dynamic.jax_trace --requests 200 --passes 3 [--tune 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report

HERE = Path(__file__).parent


def trace(requests: int, seed: int = 0) -> list[int]:
    """Sequence lengths in 8..256: log-normal around 40 (most short, a long tail)."""
    rng = np.random.default_rng(seed)
    return [int(v) for v in np.clip(np.round(rng.lognormal(np.log(40), 0.7, requests)), 8, 256)]


def served(run, lengths: list[int], d: int) -> float:
    """Seconds to serve ``lengths`` one request after another with ``run``."""
    inputs = [np.random.default_rng(k).standard_normal((n, d)).astype(np.float32) for k, n in enumerate(lengths)]
    start = time.perf_counter()
    for x in inputs:
        run(x)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--passes", type=int, default=3, help="steady passes over the trace (median)")
    parser.add_argument("--tune", type=float, default=0.0, help="tune the buckets chosen for this many seconds")
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()

    import jax
    import onnxruntime as ort
    import openvino as ov
    from jax2onnx import to_onnx

    import collage_runtime
    from collage_mlir.plan import Plan
    from collage_runtime.manifest import load_manifest
    from studies.dynamic.iree_fallback import exported, models

    encoder, shape, symbol, (lo, opt, hi), _, _ = models()["encoder"]
    d = shape[1]
    lengths = trace(args.requests)
    result = header("jax_trace") | {"requests": args.requests, "distinct": len(set(lengths)),
                                    "lengths": {"min": min(lengths), "median": statistics.median(lengths),
                                                "max": max(lengths)}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "enc.mlir").write_text(exported(encoder, shape, symbol))
        (root / "trace.json").write_text(json.dumps([{symbol: n} for n in lengths]))
        cli = [sys.executable, "-m", "collage_mlir.tools.cli"]
        dim = ["--dim", f"{symbol}={lo}:{opt}:{hi}"]
        env = os.environ | {"COLLAGE_DB": str(root / "costs.sqlite")}  # the study's own tunes, not the user's
        start = time.perf_counter()
        subprocess.run([*cli, "compile", str(root / "enc.mlir"), *dim, "--shapes", str(root / "trace.json"), "-o",
                        str(root / "art")], check=True, env=env)
        result["collage_compile_s"] = time.perf_counter() - start
        if args.tune:
            with collage_runtime.load(root / "art") as chosen:
                values = ",".join(str(b.values[symbol]) for b in chosen.table.buckets)
            start = time.perf_counter()
            subprocess.run([*cli, "tune", str(root / "enc.mlir"), *dim, "--bucket", f"{symbol}={values}", "--budget",
                            f"{args.tune:g}s", "-o", str(root / "plans")], check=True, env=env)
            subprocess.run([*cli, "compile", str(root / "enc.mlir"), *dim, "--bucket", f"{symbol}={values}",
                            "--plan", "tuned", "-o", str(root / "art")], check=True, env=env)
            result["collage_tune_s"] = time.perf_counter() - start
        program = collage_runtime.load(root / "art")
        result["plans"] = {b.label: sorted({r.backend for r in Plan.from_json(load_manifest(root / "art" / b.path).plan)
                                            .regions} or {"iree-cpu"}) for b in program.table.buckets}
        result["buckets"] = [dict(b.values) for b in program.table.buckets]
        result["fallback"] = program.table.fallback.value

        model = to_onnx(encoder, [(symbol, d)])
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        core = ov.Core()
        compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()

        ways = {"collage": lambda x: program.invoke("main", x),
                "ort": lambda x: session.run(None, {name: x}),
                "openvino": lambda x: request.infer([x])}
        for k, n in enumerate(lengths):  # every way equals jax on the first pass's inputs
            x = np.random.default_rng(k).standard_normal((n, d)).astype(np.float32)
            want = np.asarray(encoder(x))
            for label, run in ways.items():
                got = np.asarray(run(x)[0] if label != "openvino" else next(iter(run(x).values())))
                assert np.abs(got - want).max() < 1e-3, (label, n, float(np.abs(got - want).max()))
        jitted = jax.jit(encoder)
        first = served(lambda x: jitted(x).block_until_ready(), lengths, d)  # each length compiled on first use
        ways["jax.jit"] = lambda x: jitted(x).block_until_ready()
        steady = {label: [] for label in ways}
        for _ in range(args.passes):  # interleaved passes
            for label, run in ways.items():
                steady[label].append(served(run, lengths, d))
        program.close()
    seconds = {label: statistics.median(v) for label, v in steady.items()}
    result |= {"jax_jit_first_pass_s": first, "steady_s": seconds}
    best_peer = min((v, k) for k, v in seconds.items() if k != "collage")
    rows = [f"| {k} | {v * 1e3:.1f} | {args.requests / v:.0f} | {best_peer[0] / v:.2f}x |" for k, v in seconds.items()]
    write_report(args.out, "jax_trace", result,
                 f"# A JAX encoder over a trace of {args.requests} requests ({len(set(lengths))} distinct lengths "
                 f"{min(lengths)}-{max(lengths)}, median {statistics.median(lengths)})\n\n"
                 f"Command: `{result['command']}`; device: {result['device']}\n\n"
                 f"collage: buckets {', '.join(str(b[symbol]) for b in result['buckets'])}, and between them "
                 f"{result['fallback']} on the module with its dynamic dims (the fastest of IREE, ONNX Runtime "
                 f"and OpenVINO, timed at compile time), compiled ahead in {result['collage_compile_s']:.1f} s"
                 + (f", then tuned for {args.tune:g} s and compiled again ({result['collage_tune_s']:.1f} s)"
                    if args.tune else "")
                 + "; bucket plans: " + "; ".join(f"{k}: {'+'.join(v)}" for k, v in result["plans"].items()) + ".\n"
                 f"jax.jit's first pass, compiling each length on its first request: "
                 f"{first:.2f} s ({args.requests / first:.0f} requests/s).\n\n"
                 "Steady passes (median of interleaved passes):\n\n"
                 f"| way | ms for the trace | requests/s | best peer's time / this |\n|---|---|---|---|\n"
                 + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
