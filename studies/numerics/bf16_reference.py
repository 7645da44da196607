"""How far is each engine's run of a model computing in bf16 from the model's exact arithmetic, and from IREE's
bf16 run (the reference a tune checks plans against)?

Each zoo model is run whole by IREE alone in bf16 (the reference), by IREE with every bf16 value computed in f32
(``reference.PROMOTE_BF16``: the exact arithmetic), and whole on each engine (``whole:<backend>``); for a torch
model also torch eager in bf16. Per run: the largest error relative to the output's scale, from the exact
arithmetic and from the reference, and the ratio of the first to the reference's own (what
``validate.BF16_SLACK`` bounds).

    python -m studies.numerics.bf16_reference --models resnet50_bf16,bert_base_bf16,jax_resnet50_bf16
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
PLANS = ("whole:ort", "whole:openvino", "whole:openvino-bf16", "whole:xla-cpu")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def run(name: str, small: bool, plans: tuple[str, ...], root: Path) -> dict:
    import collage_runtime
    from collage_mlir import zoo
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context
    from collage_mlir.measure.reference import invoke_alone

    xs = zoo.numpy_inputs(name, small=small)
    module = zoo.import_stablehlo(name, new_context(), small=small)
    outs = {"iree bf16 (reference)": invoke_alone(module, {"main": xs})["main"][0].astype(np.float32)}
    exact = invoke_alone(module, {"main": xs}, exact=True)["main"][0]
    for plan in plans:
        try:
            compile_module(zoo.import_stablehlo(name, new_context(), small=small), plan, root / plan, source=name)
            with collage_runtime.load(root / plan) as program:
                outs[plan] = np.asarray(program.invoke("main", *xs)[0]).astype(np.float32)
        except Exception as exc:  # a study row: an engine that cannot run it is recorded, not fatal
            print(f"{name} {plan}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    model, inputs = zoo.build(name, small=small)
    import torch

    if isinstance(model, torch.nn.Module):
        with torch.no_grad():
            y = model(*inputs)
            outs["torch eager bf16"] = (y[0] if isinstance(y, tuple) else y).float().numpy()
    ref = outs["iree bf16 (reference)"]
    own = _rel(ref, exact)
    rows = {k: {"from_exact": _rel(o, exact), "from_reference": _rel(o, ref), "ratio": _rel(o, exact) / own}
            for k, o in outs.items()}
    return {"model": name + (" (small)" if small else ""), "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"{result['device']}, {result['date']}, `{result['command']}`", "",
             "Largest error relative to the output's scale: from the exact arithmetic / from IREE's bf16 run "
             "(ratio to the reference's own distance from the exact)", "",
             "| model | run | from exact | from reference | ratio |", "|---|---|---:|---:|---:|"]
    for r in result["results"]:
        for k, v in r["rows"].items():
            lines.append(f"| {r['model']} | {k} | {v['from_exact']:.3g} | {v['from_reference']:.3g} | {v['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from collage_mlir.measure.device import device_fingerprint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50_bf16,bert_base_bf16,jax_resnet50_bf16,jax_mobilenet_v2_bf16")
    ap.add_argument("--small", action="store_true", help="the zoo's small variants")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--name", default="bf16_reference")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="collage-bf16-") as tmp:
        for k, name in enumerate(args.models.split(",")):
            results.append(run(name, args.small, tuple(args.plans.split(",")), Path(tmp) / str(k)))
            print(json.dumps(results[-1]), flush=True)
    result = {"device": device_fingerprint()[1], "date": datetime.date.today().isoformat(),
              "command": "python -m studies.numerics.bf16_reference " + " ".join(argv if argv is not None else sys.argv[1:]),
              "results": results}
    (HERE / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    (HERE / f"{args.name}.md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
