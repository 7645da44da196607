"""A tuned plan's program against what a PyTorch user runs instead, on the same GPU, interleaved.

Run by `tune_on_gpu.sh` after `collage compile` of the plan `collage tune --device cuda` chose: rebuilds the
kit's torch model (`tune_kit.kit_model`: same seed, packable weights for full-size models), checks the
program against torch eager on the device and against the kit's IREE CPU outputs, then times the program,
torch eager and `torch.compile` (inductor, first call capped) as `run.py` does (inputs on the device, each
call synchronised, rounds in rotating order). Prints one markdown row; appends a `Timing` list as JSON.

    python -m studies.gpu.tuned_vs_torch ARTIFACT SPEC --inputs X.npy ... --ref REF_DIR --out OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .bundle import ModelSpec
from .run import Contender, as_list, max_error, time_interleaved, torch_contenders, torch_setup
from .tune_kit import kit_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.tuned_vs_torch", description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("spec", help="the kit's model: resnet50, resnet50:full, ...")
    p.add_argument("--inputs", type=Path, nargs="+", required=True)
    p.add_argument("--ref", type=Path, help="folder of the IREE CPU outputs (out_K.npy)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode; 'none': no torch.compile")
    p.add_argument("--compile-cap", type=float, default=45.0)
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--out", type=Path, help="appends one JSON line: model, errors, timings")
    p.add_argument("--also", action="append", default=[], metavar="ARTIFACT=LABEL",
                   help="another program of the model to time in the same rounds (e.g. its default plan)")
    args = p.parse_args(argv)

    import torch
    from collage_runtime import Program

    torch_setup(args.device)
    spec = ModelSpec.parse(args.spec)
    model, _ = kit_model(spec)
    model = model.to(args.device)
    inputs = [np.load(f) for f in args.inputs]
    xs = [torch.from_numpy(a).to(args.device) for a in inputs]
    with torch.inference_mode():
        want = [t.detach().float().cpu().numpy() for t in as_list(model(*xs))]
    program = Program(args.artifact)
    others = [(Program(Path(path)), label) for path, _, label in (a.partition("=") for a in args.also)]
    try:
        function = "main" if "main" in program.functions else program.functions[0]
        got = [np.asarray(a) for a in program.invoke(function, *inputs)]
        vs_torch = max_error(got, want)
        refs = sorted(args.ref.glob("out_*.npy")) if args.ref else []
        vs_iree_cpu = max_error(got, [np.load(r) for r in refs]) if refs else None
        fn = program.device_function(function)
        dev_args = [program.to_device(a) for a in inputs]
        contenders = [Contender("collage tuned", "collage", lambda: fn(*dev_args), lambda: None)]
        for other, label in others:
            check = max_error([np.asarray(a) for a in other.invoke(function, *inputs)], want)
            print(f"  {label}: max error vs torch eager {check:.2e}")
            ofn, oargs = other.device_function(function), [other.to_device(a) for a in inputs]
            contenders.append(Contender(label, "collage", lambda f=ofn, a=oargs: f(*a), lambda: None))
        mode = None if args.compile_mode == "none" else args.compile_mode
        contenders += torch_contenders(model, inputs, args.device, mode, args.compile_cap, want)
        timings = time_interleaved(contenders, args.seconds)
    finally:
        program.close()
        for other, _ in others:
            other.close()
    ms = {t.contender: t.median_ms for t in timings}
    best_peer = min((t for t in timings if t.kind == "peer" and t.median_ms), key=lambda t: t.median_ms, default=None)
    tuned = ms.get("collage tuned")
    ratio = f"{best_peer.median_ms / tuned:.2f}x vs {best_peer.contender}" if best_peer and tuned else "-"
    fmt = lambda v: f"{v:.3f}" if v else "-"  # noqa: E731
    print(f"| {spec.label} | {fmt(tuned)} | {fmt(ms.get('torch eager'))} | {fmt(ms.get('torch.compile'))} | {ratio} "
          f"| {vs_torch:.2e} | {'-' if vs_iree_cpu is None else f'{vs_iree_cpu:.2e}'} |")
    for _, label in others:
        print(f"  {label}: {fmt(ms.get(label))} ms in the same rounds")
    for t in timings:
        if t.status != "ok":
            print(f"  {t.contender}: {t.status}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"model": spec.label, "vs_torch": vs_torch, "vs_iree_cpu": vs_iree_cpu,
                                "timings": [asdict(t) for t in timings]}) + "\n")
    ok = vs_torch <= args.tolerance and (vs_iree_cpu is None or vs_iree_cpu <= args.tolerance)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
