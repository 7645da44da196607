"""ONNX Runtime's spinning in collage programs, three policies (``POLICIES``): the runtime's earlier one
(spinning off, except for a program whose only region is ORT: ORT's default spinning, which goes on after
a run), the runtime's now (that sole session spins inside a run and stops when it ends,
``session.force_spinning_stop``), and every session spinning inside its runs.

Programs: MobileNetV2 with every op on ORT but its last on OpenVINO (ORT is not the sole engine), the
same whole on ORT (sole), and the 20-link (256x256 matmul + tanh) chains of ``threads.py``: 20 ORT regions and
the mixed plan cycling ort/openvino/onednn/xla-cpu/iree-cpu. Each policy runs in its own process,
alternating, ``--rounds`` times: wall and process CPU per call (median of ``--calls``), and the CPU the
process burns in the 50 ms after a call.

    python -m studies.threads.ort_spin --rounds 5      # writes studies/threads/ort_spin.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
#: ORT session policies: (sole engine's spinning, force stop; other sessions' spinning, force stop).
POLICIES = {
    "before: sole spins unbounded, others off": ("1", "0", "0", "0"),
    "now: sole spins in a run and stops, others off": ("1", "1", "0", "0"),
    "all spin in a run and stop": ("1", "1", "1", "1"),
}
THREADS = 2


def build(out: Path) -> dict[str, str]:
    from collage_mlir import zoo
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context
    from collage_mlir.plan import Plan, Region
    from collage_mlir.search import resolve_plan

    from .threads import build as chains

    arts = {}
    for name, last in (("mobilenet_v2, ort + last op on openvino", "openvino"), ("mobilenet_v2, whole on ort", None)):
        module = zoo.import_stablehlo("mobilenet_v2", new_context())
        number_ops(module)
        ops = resolve_plan("whole:ort", Graph(module)).regions[0].ops
        regions = [Region("r", "ort", frozenset(ops - {max(ops)}) if last else ops)]
        regions += [Region("last", last, frozenset({max(ops)}))] if last else []
        path = out / ("mnv2_split" if last else "mnv2_whole")
        compile_module(module, Plan(regions), path)
        arts[name] = str(path)
    chain = chains(out / "chains", 20)
    arts["chain, 20 ort regions"] = str(chain["ort 20 regions"])
    arts["chain, mixed plan"] = str(chain["mixed"])
    return arts


def worker(policy: str, arts: dict[str, str], calls: int) -> dict:
    from collage_runtime.engines import Engines

    now = Engines.ort_session_options
    sole_spin, sole_stop, spin, stop = POLICIES[policy]

    def patched(self):
        opts = now(self)
        sole = self.sole == "ort"
        opts.add_session_config_entry("session.intra_op.allow_spinning", sole_spin if sole else spin)
        opts.add_session_config_entry("session.force_spinning_stop", sole_stop if sole else stop)
        return opts

    Engines.ort_session_options = patched
    import collage_runtime
    from collage_mlir import zoo

    rows = {}
    for name, path in arts.items():
        prog = collage_runtime.load(path, threads=THREADS)
        if name.startswith("mobilenet"):
            args = [prog.to_device(a) for a in zoo.numpy_inputs("mobilenet_v2")]
        else:
            rng = np.random.default_rng(0)
            args = [prog.to_device(rng.standard_normal((256, 256), np.float32)),
                    prog.to_device(rng.standard_normal((256, 256), np.float32) / 256)]
        fn = prog.device_function("main")
        fn(*args)
        wall, cpu = [], []
        for _ in range(calls):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*args)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        c0 = time.process_time()
        time.sleep(0.05)
        rows[name] = {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
                      "idle_cpu_ms": (time.process_time() - c0) * 1e3}
        prog.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        policy, arts = json.loads(a.worker)
        print(json.dumps(worker(policy, arts, a.calls)))
        return
    from studies.common.report import header, write_report

    samples: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        arts = build(Path(tmp))
        for _ in range(a.rounds):
            for policy in POLICIES:
                proc = subprocess.run([sys.executable, "-m", "studies.threads.ort_spin", "--calls", str(a.calls),
                                       "--worker", json.dumps([policy, arts])], capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"worker failed: {proc.stderr.strip().splitlines()[-1:]}")
                for name, row in json.loads(proc.stdout.splitlines()[-1]).items():
                    samples.setdefault((name, policy), []).append(row)
    head = header("ort_spin")
    rows = [{"program": n, "policy": pol, **{k: statistics.median(r[k] for r in rs) for k in rs[0]},
             "wall_ms_all": [r["wall_ms"] for r in rs]} for (n, pol), rs in samples.items()]
    lines = [f"{head['device']}, {time.strftime('%Y-%m-%d')}, `python -m studies.threads.ort_spin --rounds {a.rounds}`; "
             f"{THREADS} threads, medians of {a.rounds} alternating processes x {a.calls} calls", "",
             "| program | ORT policy | wall ms | CPU ms | idle CPU ms in the 50 ms after a call |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['program']} | {r['policy']} | {r['wall_ms']:.3f} | {r['cpu_ms']:.3f} | {r['idle_cpu_ms']:.1f} |")
    write_report(a.out, "ort_spin", {**head, "rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
