"""Whole-model-in-one-region parity: a model as ONE region of a graph engine inside a collage program
against the same engine running the model alone, interleaved in one run.

Per model and engine, these variants are timed side by side (every round runs each variant for one
sample of >= ~50 ms, an engine's variants back to back in a rotating order; wall time and process CPU
time of all threads, per call):

- ``user (torch export)``: the engine as its users run it, set up as ``collage_mlir.bench.contenders``
  does: ONNX Runtime's ``session.run`` on ``torch.onnx.export``'s ONNX with all graph optimizations and
  ORT's default (spinning) threads; OpenVINO's ``request.infer`` on the same ONNX (f32, latency hint,
  one stream); XLA: the model's StableHLO compiled as one module and run through PJRT. **The baseline.**
- ``executor (torch export)`` / ``executor (collage ONNX)``: collage's region executor and engine
  settings on torch's ONNX and on collage's translation of the whole model (ort, openvino): what the
  translation costs, apart from the wrapper and the settings;
- ``collage, one region``: the compiled collage program whose plan puts every op in one region of that
  engine, called with device-resident inputs (``Program.device_function``);
- ``collage, prefer slicing`` (with ``--slices``): the plan ``prefer:ENGINE`` (each op's largest
  candidate of at most 8 ops on the engine, the rest on IREE), what a new user would try first.

The ratio of each variant to ``user`` is the median over rounds of the per-round ratio (both timed
within seconds of each other, so the shared machine's load mostly cancels).

    python -m studies.whole_model.whole_model [--models resnet-small,encoder-small,zoo:resnet50,zoo:bert_base]
                                              [--engines ort,openvino,xla-cpu] [--rounds 15] [--threads N] [--slices]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from studies.common.report import header, write_report

import collage_runtime  # noqa: E402
from collage_runtime.engines import Engines  # noqa: E402
from collage_runtime.executors import executor  # noqa: E402

from collage_mlir.onnx import translate  # noqa: E402
from collage_mlir.frontends.torch import import_torch  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.passes.number_ops import NumberOpsPass  # noqa: E402
from collage_mlir.plan import Plan, Region  # noqa: E402


def build(name: str):
    """(nn.Module, example input) for a model name: the tests' small models, ``zoo:<name>`` or
    ``zoo-small:<name>``. Token ids are passed as int32: OpenVINO computes i64 in 32 bits, so its
    backend takes i64 only from constants, and every engine gets the same input."""
    if name.startswith(("zoo:", "zoo-small:")):
        import torch

        from collage_mlir import zoo

        kind, model_name = name.split(":", 1)
        model, inputs = zoo.build(model_name, small=kind == "zoo-small")
        x = inputs[0]
        return model, (x.to(torch.int32) if not x.is_floating_point() else x)
    from collage_mlir.zoo.tiny import encoder, resnet

    return {"resnet-small": resnet, "encoder-small": encoder}[name]()


def _main(module):
    return next(f for f in module.body.operations if str(f.attributes["sym_name"]).strip('"') == "main")


def _per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _user_ort(path: Path, xs: np.ndarray, threads: int):
    """ONNX Runtime as ``contenders.onnxruntime`` runs it: ``session.run`` with its default threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: xs}
    return lambda: session.run(None, feeds)[0]


def _user_openvino(path: Path, xs: np.ndarray, threads: int):
    """OpenVINO as ``contenders.openvino`` runs it: its own ``ov.Core``, ``request.infer``."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    compiled = ov.Core().compile_model(str(path), "CPU", {
        props.inference_num_threads: threads, props.num_streams: 1,
        hints.performance_mode: hints.PerformanceMode.LATENCY, hints.inference_precision: ov.Type.f32})
    request = compiled.create_infer_request()
    return lambda: request.infer([xs])[0]


def _user_xla(module: bytes, xs: np.ndarray):
    """The model's StableHLO compiled as one module by a PJRT CPU client of its own, input on the device."""
    from jax._src import core
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc
    from jax.sharding import SingleDeviceSharding

    client = xc.make_cpu_client(asynchronous=False)
    device = client.local_devices()[0]
    options = xc.CompileOptions()
    options.executable_build_options.debug_options.xla_cpu_enable_fast_math = False
    exe = client.compile_and_load(module, xc.DeviceList((device,)), options)
    args = [xc.batched_device_put(core.ShapedArray(xs.shape, xs.dtype), SingleDeviceSharding(device), [xs],
                                  [device], True, False, _jax.HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
                                  True)]
    return lambda: np.asarray(exe.execute(args)[0])


def _op_types(model) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node
                               if n.op_type not in ("Constant", "Identity")).items()))


def measure(name: str, engines_: list[str], rounds: int, threads: int | None, tmp: Path,
            slices: bool = False) -> list[dict]:
    import onnx
    import torch

    from collage_mlir.backends.xla_cpu import region_module_bytecode
    from collage_mlir.graph import Graph

    model, x = build(name)
    with torch.no_grad():
        want = model(x).numpy()
    xs = x.numpy()
    onnx_torch = tmp / f"{name}.torch.onnx"
    # torch's default exporter, as the bench's ort and openvino contenders use it (the TorchScript one
    # has no aten::diff, which GPT-2's mask needs)
    torch.onnx.export(model, (x,), str(onnx_torch), verbose=False)

    probe = import_torch(model, [x], new_context())
    probe_main = _main(probe)
    torch_model = onnx.load(str(onnx_torch), load_external_data=False)
    collage_model = translate(probe_main)
    counts = {"model": name, "collage_op_by_op": len(translate(probe_main, simplify=False).graph.node),
              "collage": len(collage_model.graph.node),
              "torch_export": sum(v for v in _op_types(torch_model).values()),
              "collage_op_types": _op_types(collage_model), "torch_export_op_types": _op_types(torch_model)}
    del torch_model, collage_model, probe_main, probe
    variants: dict[tuple[str, str], object] = {}
    programs = []
    for engine in engines_:
        module = import_torch(model, [x], new_context())
        NumberOpsPass().run(module)
        plan = Plan([Region("whole", engine, frozenset(Graph(module).nodes))], source=f"whole:{engine}")
        whole_text = region_module_bytecode(_main(module)) if engine == "xla-cpu" else None  # compile outlines it
        art = compile_module(module, plan, tmp / f"{name}-{engine}")
        (region,) = art.manifest.regions
        region_file = art.out_dir / region.artifact
        prog = collage_runtime.load(art.out_dir, threads=threads)
        programs.append(prog)
        n = prog.engines.threads
        engines = Engines(n)
        load = executor(region.executor)
        if engine == "xla-cpu":
            alone = {"user (StableHLO module)": _user_xla(whole_text, xs)}
        else:
            user = _user_ort if engine == "ort" else _user_openvino
            alone = {"user (torch export)": user(onnx_torch, xs, n)}
            for label, path in (("executor (torch export)", onnx_torch), ("executor (collage ONNX)", region_file)):
                run, out = load(path, engines), np.empty_like(want)
                alone[label] = lambda run=run, out=out: run([xs], [out]) or out
        del module, whole_text
        for label, run in alone.items():
            variants[(engine, label)] = run
            np.testing.assert_allclose(run(), want, rtol=1e-3, atol=1e-3)
        f, dx = prog.device_function("main"), prog.to_device(xs)
        variants[(engine, "collage, one region")] = (lambda f=f, dx=dx: f(dx))
        np.testing.assert_allclose(np.asarray(prog.invoke("main", xs)[0]), want, rtol=1e-3, atol=1e-3)
        if slices:
            sliced = compile_module(import_torch(model, [x], new_context()), f"prefer:{engine}",
                                    tmp / f"{name}-{engine}-prefer")
            counts[f"prefer_{engine}_regions"] = len(sliced.manifest.regions)
            prog = collage_runtime.load(sliced.out_dir, threads=threads)
            programs.append(prog)
            f, dx = prog.device_function("main"), prog.to_device(xs)
            variants[(engine, "collage, prefer slicing")] = (lambda f=f, dx=dx: f(dx))
            np.testing.assert_allclose(np.asarray(prog.invoke("main", xs)[0]), want, rtol=1e-3, atol=1e-3)
    first = {k: _per_call(fn, 1) for k, fn in variants.items()}  # warm up, and size the samples
    calls = {k: max(1, int(0.05 / max(t, 1e-6))) for k, t in first.items()}  # a sample is >= ~50 ms
    times: dict = {k: [] for k in variants}
    cpu: dict = {k: [] for k in variants}
    load_avg = [os.getloadavg()[0]]
    for r in range(rounds):
        for engine in engines_:  # an engine's variants back to back: their ratios compare moments apart
            group = [k for k in variants if k[0] == engine]
            for k in group[r % len(group):] + group[:r % len(group)]:  # rotated: none always runs first
                c0 = time.process_time()
                times[k].append(_per_call(variants[k], calls[k]))
                cpu[k].append((time.process_time() - c0) / calls[k])
        load_avg.append(os.getloadavg()[0])
    for prog in programs:
        prog.close()
    rows = []
    for engine in engines_:
        base = next(k for k in times if k[0] == engine and k[1].startswith("user ("))
        for (e, label), ts in times.items():
            if e == engine:
                ratios = [t / b for t, b in zip(ts, times[base])]
                cpu_ratios = [t / b for t, b in zip(cpu[(e, label)], cpu[base])]
                rows.append({"model": name, "engine": engine, "variant": label, "median_ms": statistics.median(ts) * 1e3,
                             "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3, "ratio": statistics.median(ratios),
                             "ratio_min": min(ratios), "ratio_max": max(ratios),
                             "cpu_ms": statistics.median(cpu[(e, label)]) * 1e3, "cpu_ratio": statistics.median(cpu_ratios),
                             "cpu_ratio_min": min(cpu_ratios), "cpu_ratio_max": max(cpu_ratios), "load_avg": load_avg,
                             "threads": threads})
    return rows, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet-small,encoder-small")
    p.add_argument("--engines", default="ort,openvino,xla-cpu")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--slices", action="store_true", help="also time the plan prefer:ENGINE (small regions)")
    p.add_argument("--name", default="whole_model", help="result file name stem (default whole_model)")
    p.add_argument("--out", default=str(Path(__file__).parent))
    a = p.parse_args()
    rows, counts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):  # the report is rewritten after each model: a stopped run keeps it
            r, c = measure(name, a.engines.split(","), a.rounds, a.threads, Path(tmp), a.slices)
            rows, counts = rows + r, counts + [c]
            report(a.out, a.name, rows, counts)


def report(out: str, name: str, rows: list[dict], counts: list[dict]) -> None:
    lines = ["Per call; ratios to `user` are medians (min–max) of per-round ratios.", "",
             "| model | engine | variant | wall ms median | wall min–max | wall vs user | CPU ms | CPU vs user |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['engine']} | {r['variant']} | {r['median_ms']:.3f} | "
              f"{r['min_ms']:.3f}–{r['max_ms']:.3f} | {r['ratio']:.3f} ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | "
              f"{r['cpu_ms']:.3f} | {r['cpu_ratio']:.3f} ({r['cpu_ratio_min']:.2f}–{r['cpu_ratio_max']:.2f}) |"
              for r in rows]
    loads = sorted({(r["model"], tuple(r["load_avg"])) for r in rows})
    lines += ["", f"Threads: {rows[0]['threads'] or 'all usable cores'}" if rows else ""]
    lines += ["", "Load average (1 min) before and after each round: " +
              "; ".join(f"{m}: {min(la):.1f}–{max(la):.1f}" for m, la in loads)]
    lines += ["", "ONNX nodes (without Constant and Identity nodes):", "",
              "| model | collage op by op | collage simplified | torch.onnx.export |", "|---|---:|---:|---:|"]
    lines += [f"| {c['model']} | {c['collage_op_by_op']} | {c['collage']} | {c['torch_export']} |" for c in counts]
    sliced = [f"{c['model']} {k.split('_', 1)[1].removesuffix('_regions')} {v}" for c in counts for k, v in c.items()
              if k.startswith("prefer_")]
    if sliced:
        lines += ["", "Regions of the `prefer:ENGINE` plans: " + ", ".join(sliced)]
    lines += ["", "Op types where the two ONNX graphs differ (collage simplified / torch.onnx.export):", ""]
    for c in counts:
        ours, theirs = c["collage_op_types"], c["torch_export_op_types"]
        diff = [f"{t} {ours.get(t, 0)}/{theirs.get(t, 0)}" for t in sorted(set(ours) | set(theirs))
                if ours.get(t, 0) != theirs.get(t, 0)]
        lines.append(f"- {c['model']}: {', '.join(diff) or 'none'}")
    write_report(out, name, {**header(name), "rows": rows, "onnx_nodes": counts},
                 "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
