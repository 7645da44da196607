"""Tuning shape buckets: one shared tune against a cold tune per bucket.

A model exported with a dynamic batch is tuned for every bucket of ``--dim`` two ways, each through the CLI
as a user runs it (a fresh cost DB each, so no run reads another's rows):

- **shared**: ``collage tune model.onnx --dim batch=MIN:OPT:MAX --budget B`` — one budget for all the
  buckets, the OPT bucket first, each later bucket's search seeded with the plans tuned before it;
- **cold**: ``collage tune model.onnx --dim batch=V --budget B`` once per bucket value V, each from an empty DB.

Then each bucket's two plans are compiled for that shape and timed side by side (interleaved rounds,
median). Writes ``bucket_tune.json``/``.md`` beside this file (or ``--out``):

    python -m studies.dynamic.bucket_tune --model mobilenet_v2 --dim batch=1:4:8 --budget 120 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report
from studies.common.timing import interleaved_ms

HERE = Path(__file__).parent
BACKENDS = "iree-cpu,ort,openvino"


def export(name: str, root: Path) -> Path:
    """The zoo model as ONNX with its first axis dynamic (``batch``)."""
    import torch

    from collage_mlir import zoo

    model, inputs = zoo.build(name)
    path = root / f"{name}.onnx"
    torch.onnx.export(model, inputs, str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17)
    return path


def collage(*args: str) -> float:
    """Runs ``collage ARGS`` (its output shown); its wall seconds."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def plan_summary(path: Path) -> str:
    """The plan's regions per backend, and which of the tune's finalists it was (a seed, ``carried``, ...)."""
    document = json.loads(path.read_text())
    by_backend: dict[str, int] = {}
    for r in document["regions"]:
        by_backend[r["backend"]] = by_backend.get(r["backend"], 0) + 1
    regions = ", ".join(f"{b} x{n}" for b, n in sorted(by_backend.items())) or document["default_backend"] + " alone"
    return f"{regions} (from {document['tuning']['plan']['from']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--dim", default="batch=1:4:8", help="NAME=MIN:OPT:MAX; the buckets are MIN, OPT, MAX")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds: the shared tune's, and each cold one's")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--name", default="bucket_tune")
    args = parser.parse_args(argv)

    import collage_runtime

    name, _, rng = args.dim.partition("=")
    low, opt, high = (int(v) for v in rng.split(":"))
    values = sorted({low, opt, high})
    result = header(args.name) | {"model": args.model, "dim": args.dim, "budget_s": args.budget,
                                  "backends": BACKENDS}
    with tempfile.TemporaryDirectory(prefix="collage-bucket-tune-") as tmp:
        root = Path(tmp)
        model = export(args.model, root)
        tune = ["--backends", BACKENDS, "--budget", f"{args.budget}s"]
        shared_s = collage("tune", str(model), "--dim", args.dim, *tune, "--db", str(root / "shared.db"),
                           "-o", str(root / "shared"))
        cold_s = {}
        for v in values:
            cold_s[v] = collage("tune", str(model), "--dim", f"{name}={v}", *tune, "--db", str(root / f"cold{v}.db"),
                                "-o", str(root / f"cold{v}"))
        rows = []
        for v in values:
            label = f"{name}={v}"
            plans = {"shared": root / "shared" / f"{label}.json", "cold": root / f"cold{v}" / f"{label}.json"}
            programs = {}
            for kind, plan in plans.items():
                out = root / f"art-{kind}-{v}"
                collage("compile", str(model), "--dim", f"{name}={v}", "--plan", str(plan), "-o", str(out))
                programs[kind] = collage_runtime.load(out)
            x = np.random.default_rng(v).standard_normal((v, 3, 224, 224)).astype(np.float32)
            ms = interleaved_ms({k: (lambda p=p: p.invoke("main", x)) for k, p in programs.items()}, args.rounds)
            for p in programs.values():
                p.close()
            rows.append({"bucket": label, "shared_ms": ms["shared"], "cold_ms": ms["cold"],
                         "shared_plan": plan_summary(plans["shared"]), "cold_plan": plan_summary(plans["cold"]),
                         "cold_tune_s": cold_s[v]})
    result |= {"shared_tune_s": shared_s, "cold_tune_s": sum(cold_s.values()), "buckets": rows}
    write_report(args.out, args.name, result, markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = [f"# Tuning {len(result['buckets'])} buckets of {result['model']} ({result['dim']}): shared against cold",
             "", f"`{result['command']}`", "", f"Machine: {result['device']}; backends {result['backends']}; "
             f"budget {result['budget_s']:.0f} s (shared: for all buckets; cold: per bucket).", "",
             "| bucket | plan, shared tune | plan, cold tune | shared ms | cold ms | shared / cold |",
             "|---|---|---|---:|---:|---:|"]
    for r in result["buckets"]:
        lines.append(f"| {r['bucket']} | {r['shared_plan']} | {r['cold_plan']} | {r['shared_ms']:.3f} | "
                     f"{r['cold_ms']:.3f} | {r['shared_ms'] / r['cold_ms']:.3f} |")
    each = ", ".join(f"{r['cold_tune_s']:.0f}" for r in result["buckets"])
    lines += ["", f"Tuning wall time: shared {result['shared_tune_s']:.0f} s; cold {result['cold_tune_s']:.0f} s in "
              f"all ({each})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
