"""Time of the candidates' enumeration per zoo model (every CPU backend installed), with a digest of what
it found: a change to the enumeration must keep the digest and may change only the time.

    python -m studies.tune.enumeration_time resnet50 mobilenet_v2 jax_bert_base
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

from collage_mlir import zoo
from collage_mlir.backends import registry
from collage_mlir.graph import Graph
from collage_mlir.ir import new_context
from collage_mlir.passes.number_ops import number_ops
from collage_mlir.search.candidates import enumerate_candidates
from collage_mlir.search.regions import maximal_regions
from collage_runtime.types import Platform


def main(models: list[str]) -> None:
    backends = [i.backend for i in registry().values()
                if i.backend is not None and Platform.CPU in i.backend.platforms]
    print("backends:", ", ".join(b.name for b in backends))
    for name in models:
        module = zoo.import_stablehlo(name, new_context(), False)
        number_ops(module)
        graph = Graph(module)
        t0 = time.perf_counter()
        found = enumerate_candidates(graph, backends)
        t1 = time.perf_counter()
        maximal = {b.name: maximal_regions(graph, b) for b in backends}
        t2 = time.perf_counter()
        digest = hashlib.sha256(json.dumps([[(c.backend, c.pattern, sorted(c.ops)) for c in found],
                                            {b: sorted(map(sorted, rs)) for b, rs in maximal.items()}]).encode())
        print(f"{name}: {len(graph)} ops, {len(found)} candidates in {t1 - t0:.1f} s, maximal regions "
              f"{t2 - t1:.1f} s, digest {digest.hexdigest()[:12]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["resnet50"])
