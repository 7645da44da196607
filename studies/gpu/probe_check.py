"""The transition probes of a set of backends on one platform, measured and printed (one line a pair).

    python -m studies.gpu.probe_check cuda iree-cuda,cudnn,cublas /tmp/probes.sqlite   # on the GPU machine
    python -m studies.gpu.probe_check cpu iree-cpu,onednn /tmp/probes.sqlite

On the GPU machine, with the tune kit's IREE on PYTHONPATH (see tune_on_gpu.sh's unpack step).
"""

import sys
import time

from collage_mlir.backends import get_backend
from collage_mlir.measure.db import CostDB
from collage_mlir.measure.harness import MeasureOptions
from collage_mlir.measure.transitions import measure_transitions
from collage_runtime.types import Platform


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    platform, names, db = Platform(argv[0]), argv[1].split(","), CostDB(argv[2])
    start = time.monotonic()
    for t in measure_transitions([get_backend(n) for n in names], db, MeasureOptions(platform=platform)):
        cost = "-" if t.cost_s is None else f"{t.cost_s * 1e6:.1f} us"
        print(f"{t.src:10s} -> {t.dst:10s} {t.status:6s} {cost:>10s}  {t.message[:120]}")
    print(f"{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
