"""ONNX Runtime's spinning in collage programs, under the policies of ``POLICIES`` (by the backends of the
program's regions): the runtime's earlier one (spinning off, except for a program whose only region is ORT:
ORT's default spinning, which goes on after a run); spinning inside a run and stopping when it ends
(``session.force_spinning_stop``) for that sole region only (the runtime's now); the same for every ORT
session of a program without OpenVINO, XLA or oneDNN regions; and for every session.

Programs: MobileNetV2 with every op on ORT but its last on OpenVINO or oneDNN (ORT is not the sole engine), the
same whole on ORT (sole), and the 20-link (256x256 matmul + tanh) chains of ``threads.py``: 20 ORT regions,
the mixed plan cycling ort/openvino/onednn/xla-cpu/iree-cpu, and ORT every other link with IREE, oneDNN or
OpenVINO between. Each policy runs in its own process,
alternating, ``--rounds`` times: wall and process CPU per call (median of ``--calls``), and the CPU the
process burns in the 50 ms after a call.

    python -m studies.threads.ort_spin --rounds 7      # writes studies/threads/ort_spin.{json,md}
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

from studies.common.timing import call_costs

HERE = Path(__file__).parent
#: Engines whose idle workers spin or linger: OpenVINO's TBB (1 ms), XLA's pool, OpenMP under torch.
NOISY = {"openvino", "xla-cpu", "onednn"}
#: ORT session policies, by the backends of the program's regions, one entry per region:
#: (allow_spinning, force_spinning_stop).
POLICIES = {
    "before: a sole ORT region spins unbounded, else off":
        lambda b: ("1", "0") if b == ["ort"] else ("0", "0"),
    "a sole ORT region spins in a run and stops, else off":
        lambda b: ("1", "1") if b == ["ort"] else ("0", "0"),
    "spin in a run and stop, unless openvino/xla/onednn regions":
        lambda b: ("0", "0") if NOISY & set(b) else ("1", "1"),
    "every session spins in a run and stops": lambda b: ("1", "1"),
}
THREADS = 2


def build(out: Path) -> dict[str, str]:
    import networkx as nx

    from collage_mlir import zoo
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context
    from collage_mlir.plan import Plan, Region
    from collage_mlir.search import resolve_plan

    from collage_mlir.ir import parse_module

    from .threads import build as chains
    from .threads import chain as threads_chain

    arts = {}
    for name, last in (("mobilenet_v2, ort + last op on openvino", "openvino"),
                       ("mobilenet_v2, ort + last op on onednn", "onednn"), ("mobilenet_v2, whole on ort", None)):
        module = zoo.import_stablehlo("mobilenet_v2", new_context())
        number_ops(module)
        graph = Graph(module)
        ops = resolve_plan("whole:ort", graph).regions[0].ops
        # The classifier's matmul on the other engine, what follows it (the bias) on IREE, the rest on ORT.
        dot = max(i for i, n in graph.nodes.items() if n.name == "stablehlo.dot_general")
        tail = {dot} | nx.descendants(graph.dag, dot)
        regions = [Region("r", "ort", frozenset(ops - tail) if last else ops)]
        regions += [Region("last", last, frozenset({dot}))] if last else []
        path = out / f"mnv2_{last or 'whole'}"
        compile_module(module, Plan(regions), path)
        arts[name] = str(path)
    chain = chains(out / "chains", 20)
    arts["chain, 20 ort regions"] = str(chain["ort 20 regions"])
    arts["chain, mixed plan"] = str(chain["mixed"])
    for cycle in (("ort", "iree-cpu"), ("ort", "onednn"), ("ort", "openvino")):  # ORT every other link
        plan = Plan([Region(f"l{k}", cycle[k % 2], frozenset({2 * k, 2 * k + 1})) for k in range(20)
                     if cycle[k % 2] != "iree-cpu"])
        compile_module(parse_module(threads_chain(20), new_context()), plan, out / "+".join(cycle))
        arts[f"chain, {' / '.join(cycle)}"] = str(out / "+".join(cycle))
    return arts


def worker(policy: str, arts: dict[str, str], calls: int) -> dict:
    from collage_runtime.engines import Engines

    now = Engines.ort_session_options
    rule = POLICIES[policy]
    setting = []  # the program being loaded's (allow_spinning, force_spinning_stop)

    def patched(self):
        opts = now(self)
        opts.add_session_config_entry("session.intra_op.allow_spinning", setting[0])
        opts.add_session_config_entry("session.force_spinning_stop", setting[1])
        return opts

    Engines.ort_session_options = patched
    import collage_runtime
    from collage_mlir import zoo
    from collage_runtime.manifest import load_manifest

    rows = {}
    for name, path in arts.items():
        setting[:] = rule([r.backend for r in load_manifest(Path(path)).regions])
        prog = collage_runtime.load(path, threads=THREADS)
        if name.startswith("mobilenet"):
            args = [prog.to_device(a) for a in zoo.numpy_inputs("mobilenet_v2")]
        else:
            rng = np.random.default_rng(0)
            args = [prog.to_device(rng.standard_normal((256, 256), np.float32)),
                    prog.to_device(rng.standard_normal((256, 256), np.float32) / 256)]
        fn = prog.device_function("main")
        rows[name] = call_costs(lambda: fn(*args), calls)
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
                                       "--worker", json.dumps([policy, arts])], capture_output=True, text=True,
                                      cwd=HERE.parent.parent)
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
