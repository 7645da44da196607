"""Whole-model-in-one-region parity: a model as ONE region of a graph engine inside a collage program
against the same engine running the model alone, interleaved in one run.

Per model and engine, three variants timed side by side (wall clock, per call, median over
interleaved rounds):

- ``alone (torch export)``: the engine on ``torch.onnx.export``'s ONNX (ort, openvino) or on the model's
  StableHLO as one module (xla-cpu), through the same executor and engine settings collage uses;
- ``alone (collage ONNX)``: the engine on collage's translation of the whole model (ort, openvino):
  the translation's cost apart from the wrapper;
- ``collage, one region``: the compiled collage program whose plan puts every op in one region of that
  engine, called with device-resident inputs (``Program.device_function``).

The ratio ``collage / alone (torch export)`` is what a user pays for running the engine through collage.

    python bench/whole_model.py [--models resnet-small,encoder-small,zoo:resnet50,zoo:bert_base]
                                [--engines ort,openvino,xla-cpu] [--rounds 7] [--threads N]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from report import header, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test" / "python"))

import collage_runtime  # noqa: E402
from collage_runtime.engines import Engines  # noqa: E402
from collage_runtime.executors import executor  # noqa: E402

from collage_mlir.backends import get_backend  # noqa: E402
from collage_mlir.backends.onnx_export import translate  # noqa: E402
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
    from test_graph_translation import encoder, resnet

    return {"resnet-small": resnet, "encoder-small": encoder}[name]()


def _main(module):
    return next(f for f in module.body.operations if str(f.attributes["sym_name"]).strip('"') == "main")


def _per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def measure(name: str, engines_: list[str], rounds: int, threads: int | None, tmp: Path) -> list[dict]:
    import torch

    from collage_mlir.backends.xla_cpu import region_module_text

    model, x = build(name)
    with torch.no_grad():
        want = model(x).numpy()
    xs = x.numpy()
    onnx_torch = tmp / f"{name}.torch.onnx"
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False)
    onnx_torch.write_bytes(buf.getvalue())
    import onnx

    probe_module = import_torch(model, [x], new_context())
    real = [n for n in onnx.load_from_string(buf.getvalue()).graph.node if n.op_type not in ("Constant", "Identity")]
    counts = {"model": name, "collage_op_by_op": len(translate(_main(probe_module), simplify=False).graph.node),
              "collage": len(translate(_main(probe_module)).graph.node), "torch_export": len(real)}
    variants: dict[tuple[str, str], object] = {}
    programs = []
    for engine in engines_:
        backend = get_backend(engine)
        module = import_torch(model, [x], new_context())
        NumberOpsPass().run(module)
        from collage_mlir.graph import Graph

        plan = Plan([Region("whole", engine, frozenset(Graph(module).nodes))], source=f"whole:{engine}")
        whole_text = region_module_text(_main(module)) if engine == "xla-cpu" else None
        collage_onnx = None if engine == "xla-cpu" else translate(_main(module)).SerializeToString()
        art = compile_module(module, plan, tmp / f"{name}-{engine}")
        (region,) = art.manifest["regions"]
        prog = collage_runtime.load(art.out_dir, threads=threads)
        programs.append(prog)
        engines = Engines(prog.engines.threads)
        load = executor(region["executor"])
        if engine == "xla-cpu":
            path = tmp / f"{name}.xla.mlir"
            path.write_text(whole_text)
            alone = {"alone (StableHLO module)": load(path, engines)}
        else:
            path = tmp / f"{name}.collage.{backend.suffix.lstrip('.')}"
            path.write_bytes(collage_onnx)
            alone = {"alone (torch export)": load(onnx_torch, engines), "alone (collage ONNX)": load(path, engines)}
        out = np.empty_like(want)
        for label, run in alone.items():
            variants[(engine, label)] = (lambda run=run, out=out: run([xs], [out]))
            run([xs], [out])
            np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)
        f, dx = prog.device_function("main"), prog.to_device(xs)
        variants[(engine, "collage, one region")] = (lambda f=f, dx=dx: f(dx))
        np.testing.assert_allclose(np.asarray(prog.invoke("main", xs)[0]), want, rtol=1e-3, atol=1e-3)
    first = {k: _per_call(fn, 1) for k, fn in variants.items()}  # warm up, and size the rounds
    calls = {k: max(3, int(0.3 / max(t, 1e-5))) for k, t in first.items()}
    times: dict = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            times[k].append(_per_call(fn, calls[k]))
    for prog in programs:
        prog.close()
    rows = []
    for engine in engines_:
        base = next(statistics.median(times[k]) for k in times if k[0] == engine and k[1].startswith("alone ("))
        for (e, label), ts in times.items():
            if e == engine:
                med = statistics.median(ts)
                rows.append({"model": name, "engine": engine, "variant": label, "median_ms": med * 1e3,
                             "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3, "ratio": med / base})
    return rows, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet-small,encoder-small")
    p.add_argument("--engines", default="ort,openvino,xla-cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = p.parse_args()
    rows, counts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):  # the report is rewritten after each model: a stopped run keeps it
            r, c = measure(name, a.engines.split(","), a.rounds, a.threads, Path(tmp))
            rows, counts = rows + r, counts + [c]
            report(a.out, rows, counts)


def report(out: str, rows: list[dict], counts: list[dict]) -> None:
    lines = ["| model | engine | variant | median ms | min–max ms | vs engine alone |", "|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['engine']} | {r['variant']} | {r['median_ms']:.3f} | "
              f"{r['min_ms']:.3f}–{r['max_ms']:.3f} | {r['ratio']:.2f}x |" for r in rows]
    lines += ["", "ONNX nodes (torch.onnx.export's without its Constant and Identity nodes):", "",
              "| model | collage op by op | collage simplified | torch.onnx.export |", "|---|---:|---:|---:|"]
    lines += [f"| {c['model']} | {c['collage_op_by_op']} | {c['collage']} | {c['torch_export']} |" for c in counts]
    write_report(out, "whole_model", {**header("whole_model"), "rows": rows, "onnx_nodes": counts},
                 "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
