"""Thread settings: a chain of 20 (256x256 matmul + tanh) links run by an engine alone, as one collage
region, as 20 collage regions, and as a mixed plan cycling ort/openvino/onednn/xla-cpu/iree-cpu, under
ONNX Runtime thread configurations (the collage runtime's, ORT's spinning default, ORT's global pool).

Each configuration runs in its own process (ORT's global pool is process-wide and set once); rounds
alternate the processes, so every configuration sees the same neighbours. Per call: wall ms, the
process's CPU ms (all threads) and utilisation = CPU / (wall x threads); ``idle_cpu_ms`` is the CPU the
process burns during 50 ms of sleep right after a call (spinning workers show up there).

    python -m studies.threads.threads [--rounds 5] [--links 20] [--threads 2] [--out studies/threads/threads]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from studies.common.timing import call_costs

N = 256
MIXED = ("ort", "openvino", "onednn", "xla-cpu", "iree-cpu")
CONFIGS = ("collage", "ort-spinning", "ort-global-pool")


def chain(links: int) -> str:
    from collage_mlir.zoo.chain import matmul_tanh_chain

    return matmul_tanh_chain(N, links)


def build(out: Path, links: int) -> dict[str, Path]:
    """Artifacts: per engine one region and ``links`` regions; the mixed plan; IREE alone."""
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.plan import Plan, Region

    def compile_(name: str, plan) -> Path:
        compile_module(parse_module(chain(links), new_context()), plan, out / name)
        return out / name

    ops = lambda k: frozenset({2 * k, 2 * k + 1})  # noqa: E731
    arts = {"iree-cpu": compile_(
        "iree", Plan(source="default"))}
    for b in ("ort", "openvino"):
        arts[f"{b} 1 region"] = compile_(f"{b}1", Plan([Region("all", b, frozenset().union(*map(ops, range(links))))]))
        arts[f"{b} {links} regions"] = compile_(f"{b}n", Plan([Region(f"l{k}", b, ops(k)) for k in range(links)]))
    mixed = [Region(f"l{k}", MIXED[k % len(MIXED)], ops(k)) for k in range(links) if MIXED[k % len(MIXED)] != "iree-cpu"]
    arts["mixed"] = compile_("mixed", Plan(mixed))
    return arts


def _engine_alone(art: Path, engine: str, threads: int, global_pool: bool):
    """The one-region artifact's ONNX file run by the engine itself, its own defaults plus ``threads``
    (ORT: on the global pool where the process has one; ORT refuses per-session pools beside it)."""
    onnx = next((art / "regions").glob("*.onnx"))
    if engine == "ort":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.use_per_session_threads = not global_pool
        sess = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])
        return lambda x, w: sess.run(None, {"in0": x, "in1": w})
    import openvino as ov
    import openvino.properties as props

    compiled = ov.Core().compile_model(str(onnx), "CPU", {props.inference_num_threads: threads})
    request = compiled.create_infer_request()
    return lambda x, w: request.infer([x, w])


def worker(config: str, arts: dict[str, str], threads: int, calls: int) -> dict:
    """Runs in its own process: times every artifact (and each engine alone) under ``config``."""
    if config != "collage":
        import onnxruntime as ort

        from collage_runtime.engines import Engines

        base = Engines.ort_session_options
        if config == "ort-global-pool":
            ort.set_global_thread_pool_sizes(threads, 1)

        def options(self):
            opts = base(self)
            if config == "ort-spinning":
                opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
            elif config.startswith("ort-spin-"):  # spinning bounded to N µs after the last work
                opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
                opts.add_session_config_entry("session.intra_op.spin_duration_us", config.removeprefix("ort-spin-"))
            else:
                opts.use_per_session_threads = False
            return opts

        Engines.ort_session_options = options
    import collage_runtime

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((N, N), np.float32), rng.standard_normal((N, N), np.float32) / N
    fns = {}
    progs = []
    for name, path in arts.items():
        prog = collage_runtime.load(path, threads=threads)
        progs.append(prog)
        fns[name] = (lambda f, dx, dw: lambda: f(dx, dw))(prog.device_function("main"), prog.to_device(x),
                                                         prog.to_device(w))
    for engine in ("ort", "openvino"):
        fn = _engine_alone(Path(arts[f"{engine} 1 region"]), engine, threads, config == "ort-global-pool")
        fns[f"{engine} alone"] = lambda fn=fn: fn(x, w)
    return {name: call_costs(fn, calls) for name, fn in fns.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--links", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", default=str(Path(__file__).parent / "threads"))
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"ORT configurations, of {', '.join(CONFIGS)} and ort-spin-<µs> (spinning bounded)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        config, arts = json.loads(a.worker)
        print(json.dumps(worker(config, arts, a.threads, a.calls)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        arts = {k: str(v) for k, v in build(Path(tmp), a.links).items()}
        samples: dict[tuple[str, str], list[dict]] = {}
        for _ in range(a.rounds):
            for config in a.configs.split(","):
                cmd = [sys.executable, "-m", "studies.threads.threads", "--threads", str(a.threads), "--calls", str(a.calls),
                       "--worker", json.dumps([config, arts])]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parents[2])
                if proc.returncode:
                    sys.exit(f"{config} worker failed: {proc.stderr.strip().splitlines()[-1:]}")
                out = proc.stdout.splitlines()[-1]
                for name, row in json.loads(out).items():
                    samples.setdefault((config, name), []).append(row)
    rows = []
    for (config, name), rs in samples.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        spread = {f"{k}_spread": (max(r[k] for r in rs) - min(r[k] for r in rs)) / med[k] if med[k] else 0.0
                  for k in ("wall_ms",)}
        rows.append({"config": config, "program": name, **med, **spread,
                     "utilisation": med["cpu_ms"] / (med["wall_ms"] * a.threads)})
    lines = [f"{a.links} links of ({N}x{N} matmul + tanh), {a.threads} threads, medians of {a.rounds} rounds "
             f"x {a.calls} calls:", "",
             "| ORT config | program | wall ms | spread | CPU ms | utilisation | idle CPU ms / 50 ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['program']} | {r['wall_ms']:.2f} | {r['wall_ms_spread']:.0%} | "
                     f"{r['cpu_ms']:.2f} | {r['utilisation']:.0%} | {r['idle_cpu_ms']:.1f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
