"""A PyTorch user's int8 choices against ``collage_mlir.torch.compile(model, [x], precision="int8",
calibrate=batches)``, on zoo models, timed side by side, interleaved:

- ``eager`` and ``inductor`` (``torch.compile``): f32;
- ``eager dynamic int8``: ``torch.ao.quantization.quantize_dynamic`` of the ``nn.Linear`` layers (transformers);
- ``inductor pt2e int8``: PyTorch's x86 int8 recipe, ``X86InductorQuantizer`` with ``prepare_pt2e`` and
  ``convert_pt2e`` (torchao), calibrated on the same batches, then ``torch.compile``;
- ``collage int8``: the Python entry point quantizing from the same batches, with ``--plan`` (default
  ``whole:openvino``, what ``collage tune`` picks for int8 on this CPU: ``studies/int8/README.md``);
- ``collage f32``: the f32 model with the same plan.

Each int8 contender's error is read against f32 eager on the held-out batches (the last quarter): the
largest error relative to the output's scale, and the share of rows whose top class changed (seeded
weights: how far int8 moves the outputs, not accuracy). Writes ``torch_int8.json`` and ``.md`` beside
this file (or ``--name``). From the repository root:

    python -m studies.int8.torch_int8 --models bert_base,resnet50 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

from studies.common.timing import interleaved_ms
from studies.int8.int8_zoo import isa

HERE = Path(__file__).parent
BATCHES = 8


def _calibration(name: str, example) -> list:
    """``BATCHES`` seeded batches shaped like ``example``: token ids in its range, else standard normal."""
    import torch

    g = torch.Generator().manual_seed(1)
    if example.dtype in (torch.int64, torch.int32):
        high = int(example.max()) + 1
        return [torch.randint(0, high, tuple(example.shape), generator=g, dtype=example.dtype) for _ in range(BATCHES)]
    return [torch.randn(tuple(example.shape), generator=g) for _ in range(BATCHES)]


def _pt2e(model, example, batches):
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (example,)).module(), quantizer)
    for b in batches:
        prepared(b)
    return torch.compile(convert_pt2e(prepared))


def _error(got: np.ndarray, want: np.ndarray) -> dict:
    rows = want.reshape(-1, want.shape[-1])
    return {"max_rel_error": float(np.abs(got - want).max() / np.abs(want).max()),
            "top1_changed": float(np.mean(rows.argmax(-1) != got.reshape(rows.shape).argmax(-1)))}


def run_model(name: str, plan: str, rounds: int) -> dict:
    import torch

    import collage_mlir.torch as ct
    from collage_mlir import zoo

    model, (example,) = zoo.build(name)
    batches = _calibration(name, example)
    held = batches[-max(1, BATCHES // 4):]
    transformer = example.dtype in (torch.int64, torch.int32)
    contenders, compile_s, failed = {}, {}, {}

    def build(label, make):
        t = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = make()
                with torch.no_grad():
                    fn(example)  # torch.compile compiles here
        except Exception as exc:  # noqa: BLE001  a contender that cannot take the model is a row, not the end
            failed[label] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            return
        compile_s[label] = time.perf_counter() - t
        contenders[label] = fn

    build("eager", lambda: model)
    build("inductor", lambda: torch.compile(model))
    if transformer:
        build("eager dynamic int8",
              lambda: torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8))
    build("inductor pt2e int8", lambda: _pt2e(model, example, batches))
    build("collage int8", lambda: ct.compile(model, [example], precision="int8", calibrate=batches, plan=plan))
    build("collage f32", lambda: ct.compile(model, [example], plan=plan))
    with torch.no_grad():
        want = np.concatenate([model(b).numpy() for b in held])
        errors = {label: _error(np.concatenate([np.asarray(fn(b)) for b in held]), want)
                  for label, fn in contenders.items() if label != "eager"}
        ms = interleaved_ms({k: (lambda fn=fn: fn(example)) for k, fn in contenders.items()}, rounds)
    return {"ms": ms, "compile_s": compile_s, "errors": errors, "failed": failed,
            "agreement": contenders["collage int8"].agreement.line() if "collage int8" in contenders else "-"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="bert_base,resnet50")
    p.add_argument("--plan", default="whole:openvino")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="torch_int8")
    a = p.parse_args()
    import torch

    torch.set_num_threads(2)
    results = {"isa": isa(), "date": time.strftime("%Y-%m-%d"), "plan": a.plan, "rounds": a.rounds, "models": {}}
    for name in a.models.split(","):
        results["models"][name] = run_model(name, a.plan, a.rounds)
        print(name, json.dumps(results["models"][name]["ms"]), flush=True)
    (HERE / f"{a.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    labels = list(dict.fromkeys(k for r in results["models"].values() for k in [*r["ms"], *r["failed"]]))
    lines = [f"ISA {results['isa']}, {results['date']}, plan {a.plan}, median ms of {a.rounds} interleaved rounds "
             "(compile s in brackets; error against f32 eager on the held-out batches: max of the output's scale, "
             "top class changed)", "", "| model | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, r in results["models"].items():
        cells = []
        for k in labels:
            if k not in r["ms"]:
                cells.append("failed" if k in r["failed"] else "-")
                continue
            err = r["errors"].get(k)
            cells.append(f"{r['ms'][k]:.2f} ({r['compile_s'][k]:.0f} s)" + (
                f"<br>{100 * err['max_rel_error']:.1f} %, {100 * err['top1_changed']:.0f} %" if err else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {name}: collage's check: {r['agreement']}" for name, r in results["models"].items()]
    lines += [f"- {name}, {k} failed: {why}" for name, r in results["models"].items() for k, why in r["failed"].items()]
    (HERE / f"{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
