"""Load time and per-call time of one artifact (medians of ``--calls`` calls after one warm-up), wall
and process CPU; the input is random data of the artifact's ``main`` signature.

    collage compile resnet50.mlir --plan prefer:ort -o /tmp/r50_ort       # e.g. the zoo's ResNet-50
    python -m studies.runtime_loading.load_and_call /tmp/r50_ort [--calls 5] [--threads N]
    PYTHONPATH=/tmp/collage-before/runtime python -m studies.runtime_loading.load_and_call /tmp/r50_ort   # previous runtime
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import collage_runtime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    kwargs = {} if a.threads is None else {"threads": a.threads}
    t0, c0 = time.perf_counter(), time.process_time()
    prog = collage_runtime.load(a.artifact, **kwargs)
    load_wall, load_cpu = time.perf_counter() - t0, time.process_time() - c0
    rng = np.random.default_rng(0)
    fn = prog.vm_module.lookup_function("main")
    decl = fn.reflection.get("iree.abi.declaration", "")
    from collage_runtime.types import parse_declaration

    args = [prog.to_device(rng.standard_normal(s.shape).astype(s.dtype)) for s in parse_declaration(decl).inputs]
    f = prog.device_function("main")
    f(*args)
    wall, cpu = [], []
    for _ in range(a.calls):
        t0, c0 = time.perf_counter(), time.process_time()
        f(*args)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(f"{a.artifact}: {len(prog.manifest.regions)} regions; load {load_wall:.2f} s wall, {load_cpu:.2f} s CPU; "
          f"call {statistics.median(wall) * 1e3:.1f} ms wall, {statistics.median(cpu) * 1e3:.1f} ms CPU (medians)")
    prog.close()


if __name__ == "__main__":
    main()
