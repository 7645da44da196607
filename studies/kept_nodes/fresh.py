"""Kept-node and whole-ORT programs against ONNX Runtime as its users run the same file, each run in a
fresh process: ``kept.py`` and ``ort_threads.py`` compare sessions inside one process, where a
session's memory and threads land moved its time by 10 % (the second session a process created ran ~10 %
slower whatever its options). Runners, alternating, ``--rounds`` times, each the median of ``--calls``
calls:

- ``ort``: ``InferenceSession(path)`` with ORT's defaults on the model file;
- ``program``: the collage program (CumProd over x[1024, 256], 1 MB, kept as ONNX under ``default``;
  MobileNetV2 under ``whole:ort``);
- ``program, pinned``: the same with ORT's worker pinned to the second processor
  (``session.intra_op_thread_affinities``), as ORT pins its workers when it picks the count itself;
- ``program, spinning on after a run``: ORT's workers left spinning when a run ends, as ORT's defaults
  leave them (``session.force_spinning_stop=0``; the runtime stops them: a core burnt ~35 ms after every
  call otherwise);
- ``Identity program``: a program handing x[1024, 256] on (the cost of any program call).

    python -m studies.kept_nodes.fresh --rounds 3    # writes studies/kept_nodes/fresh.{json,md}
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report

CHILD = """
import statistics, sys, time
import numpy as np
what, mode, x, calls = sys.argv[1], sys.argv[2], np.load(sys.argv[3]), int(sys.argv[4])
if mode == "ort":
    import onnxruntime as ort
    session = ort.InferenceSession(what, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, {"x": x})
else:
    import collage_runtime
    from collage_runtime.engines import Engines
    options = Engines.ort_session_options
    def patched(self):
        opts = options(self)
        if mode == "pinned":
            opts.add_session_config_entry("session.intra_op_thread_affinities", "2")
        if mode == "spinning":
            opts.add_session_config_entry("session.force_spinning_stop", "0")
        return opts
    Engines.ort_session_options = patched
    program = collage_runtime.load(what, threads=2)
    run = lambda: program.invoke("main", x)
for _ in range(5):
    run()
times = []
for _ in range(calls):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e3)
"""


def main() -> None:
    from collage_mlir.iree import compile_file
    from studies.kept_nodes.kept import cumprod_alone
    from studies.kept_nodes.ort_threads import mobilenet_onnx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    parser.add_argument("--name", default="fresh")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="collage-fresh-") as tmp:
        tmp = Path(tmp)
        models = {"CumProd 1 MB": (cumprod_alone(tmp / "c.onnx", 1024), "default", (1024, 256)),
                  "MobileNetV2": (mobilenet_onnx(tmp / "m.onnx"), "whole:ort", (1, 3, 224, 224))}
        runners: dict[tuple[str, str], tuple[str, str, Path]] = {}
        for name, (path, plan, shape) in models.items():
            out = tmp / name.split()[0]
            compile_file(path, output_dir=out, plan=plan)
            x = tmp / f"{out.name}.npy"
            np.save(x, (1 + np.random.default_rng(1).standard_normal(shape) * 1e-3).astype(np.float32))
            runners[(name, "ort")] = (str(path), "ort", x)
            runners[(name, "program")] = (str(out), "program", x)
            runners[(name, "program, pinned")] = (str(out), "pinned", x)
            runners[(name, "program, spinning on after a run")] = (str(out), "spinning", x)
        identity = cumprod_alone(tmp / "i.onnx", 1024, "Identity")
        compile_file(identity, output_dir=tmp / "identity", plan="default")
        runners[("CumProd 1 MB", "Identity program")] = (str(tmp / "identity"), "program", tmp / "CumProd.npy")
        samples: dict[tuple[str, str], list[float]] = {k: [] for k in runners}
        for _ in range(args.rounds):
            for key, (what, mode, x) in runners.items():
                out = subprocess.run([sys.executable, "-c", CHILD, what, mode, str(x), str(args.calls)],
                                     capture_output=True, text=True, check=True).stdout
                samples[key].append(float(out.split()[-1]))
    rows = [{"model": m, "runner": r, "runs_ms": v, "ms": statistics.median(v)} for (m, r), v in samples.items()]
    result = {**header("kept_fresh"), "rows": rows}
    lines = [f"# Programs and ONNX Runtime, each in a fresh process ({result['device']})", "",
             f"`{result['command']}`", "", "| model | runner | median ms | runs |", "|---|---|---:|---|"]
    lines += [f"| {r['model']} | {r['runner']} | {r['ms']:.4f} | {', '.join(f'{v:.3f}' for v in r['runs_ms'])} |"
              for r in rows]
    write_report(args.out, args.name, result, "\n".join(lines + [""]))


if __name__ == "__main__":
    main()
