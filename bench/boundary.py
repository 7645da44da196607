"""Per-boundary overhead of each library and graph-level backend, in µs, vs tensor size.

A region's end-to-end time through a compiled artifact (IREE calls the ``collage_rt`` import, which maps
the buffers, allocates the result and runs the executor) minus the executor's own ``run`` on the same
arrays in-process is what crossing the boundary costs. The region is one matmul (M x 8) x (8 x 8)
with M = N / 8, so input and output both hold N floats.

    python bench/boundary.py [--backends ...] [--sizes 1024,16384,...] [--out bench/results/boundary]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cpu_ops import time_call  # noqa: E402

import collage_runtime  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.backends import BackendKind  # noqa: E402
from collage_mlir.ir import new_context, parse_module  # noqa: E402
from collage_mlir.search import available_backends  # noqa: E402

SIZES = (1024, 16384, 262144, 1048576, 4194304)


def _module(m: int) -> str:
    return (f"func.func @mm(%a: tensor<{m}x8xf32>, %b: tensor<8x8xf32>) -> tensor<{m}x8xf32> {{\n"
            f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{m}x8xf32>, "
            f"tensor<8x8xf32>) -> tensor<{m}x8xf32>\n  return %0 : tensor<{m}x8xf32>\n}}\n")


def measure(backend: str, n: int) -> dict:
    m = n // 8
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        art = compile_module(parse_module(_module(m), new_context()), f"prefer:{backend}", tmp)
        (region,) = art.manifest["regions"]
        with collage_runtime.load(tmp) as prog:
            e2e = time_call(prog.device_function("mm"), [prog.to_device(a), prog.to_device(b)], budget_s=1.0)
        run = importlib.import_module(region["executor"]).load(Path(tmp) / region["artifact"])
        out = np.empty((m, 8), np.float32)
        alone = time_call(lambda: run([a, b], [out]), [], budget_s=1.0)
    # Minimums: the overhead is a difference of two noisy times, and the minimum is the stable statistic.
    return {"backend": backend, "elements": n, "e2e_us": e2e["min_ms"] * 1e3, "executor_us": alone["min_ms"] * 1e3,
            "overhead_us": (e2e["min_ms"] - alone["min_ms"]) * 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=",".join(b.name for b in available_backends()
                                                  if b.kind != BackendKind.CODEGEN))
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "boundary"))
    a = p.parse_args()
    rows = [measure(b, int(n)) for b in a.backends.split(",") for n in a.sizes.split(",")]
    sizes = sorted({r["elements"] for r in rows})
    lines = ["| backend | " + " | ".join(f"{n} floats" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for b in dict.fromkeys(r["backend"] for r in rows):
        cells = {r["elements"]: r for r in rows if r["backend"] == b}
        lines.append(f"| {b} | " + " | ".join(f"{cells[n]['overhead_us']:.0f}" for n in sizes) + " |")
    table = ("Per-boundary overhead, µs (minimum end-to-end region time minus minimum time of the executor alone, "
             "same arrays):\n\n" + "\n".join(lines))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
