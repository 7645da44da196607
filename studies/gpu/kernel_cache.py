"""Compiles, here, every kernel a GPU tune of a model may ask for: each candidate region of each kernel
backend (every tactic), extracted and lowered as the measurement builds it, into a kernel cache
(``COLLAGE_CACHE_DIR``'s ``kernels/``) that the kit carries. Kernels are cached by template, spec, tactic and
architecture, so the GPU machine's tune finds them there and compiles only what this missed (with its own
Triton).

    python -m studies.gpu.kernel_cache MODEL.mlir CACHE_DIR --backends triton,triton@* [--arch sm_90]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def precompile(model: Path, backends: list[str], arch: str) -> tuple[int, int]:
    """(regions lowered, failures) for every candidate of ``backends`` in ``model``; the kernels land in the
    cache ``COLLAGE_CACHE_DIR`` names."""
    from collage_mlir.artifact import partition
    from collage_mlir.backends import expand_names, get_backend
    from collage_mlir.errors import CollageError
    from collage_mlir.frontends import load_model
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.measure.extract import extract_region

    module = load_model(str(model), new_context())
    number_ops(module)
    graph = Graph(module)
    done = failed = 0
    seen: set[tuple[str, str]] = set()
    for name in expand_names(backends):
        backend = get_backend(name)
        for cand in backend.candidates(graph):
            region = extract_region(graph, cand.ops)
            if (name, region.hash) in seen:  # the same structure elsewhere in the model: the same kernel
                continue
            seen.add((name, region.hash))
            sub = parse_module(region.bytecode, new_context())
            number_ops(sub)
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    partition(sub, region.plan(name, "iree-cuda"), tmp, [f"--iree-cuda-target={arch}"])
                    done += 1
                except CollageError as exc:
                    failed += 1
                    print(f"  {name} {sorted(cand.ops)[:4]}...: {exc}", file=sys.stderr)
    return done, failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.kernel_cache", description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("cache", type=Path)
    p.add_argument("--backends", default="triton,triton@*")
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args(argv)
    os.environ["COLLAGE_CACHE_DIR"] = str(args.cache.resolve())
    start = time.perf_counter()
    done, failed = precompile(args.model, [b.strip() for b in args.backends.split(",")], args.arch)
    kernels = list((args.cache / "kernels").glob("*.cubin"))
    size = sum(k.stat().st_size for k in kernels)
    print(f"{args.model.name}: {done} regions lowered ({failed} failed), {len(kernels)} kernels "
          f"({size / 2**20:.1f} MiB) in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
