"""`collage demo`: a small CNN built in code, imported through torch-mlir, compiled with a plan that
mixes iree-cpu and onednn, run, checked against IREE alone, and its placement printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def build_cnn():
    """A small image classifier: two conv+relu blocks, pooling, a linear head."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).eval()


def run_demo(out: Path, tune_budget_s: float | None = None) -> int:
    """Builds, compiles (by ``prefer:onednn,iree-cpu``, or by a plan `collage tune` finds within
    ``tune_budget_s`` over iree-cpu and onednn), runs and checks the demo CNN."""
    import torch
    from rich.console import Console
    from rich.table import Table

    import collage_runtime

    from ..iree import compile_module
    from ..backends import get_backend
    from ..frontends.torch import import_torch
    from ..ir import new_context

    console = Console()
    model = build_cnn()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    console.print("[bold]1.[/] importing a small CNN through torch-mlir (cached after the first run)")
    module = import_torch(model, [x], new_context())
    plan = "prefer:onednn,iree-cpu"
    if tune_budget_s is not None:
        from .tune_cmd import print_summary, tune_model

        console.print(f"    tuning its placement over iree-cpu and onednn ({tune_budget_s:.0f} s search budget)")
        tuned = tune_model(module, {"main": [x.numpy()]}, [get_backend("iree-cpu"), get_backend("onednn")],
                           tune_budget_s, 0, None)
        print_summary(tuned, "(demo)")
        plan = tuned.plan
    mixed = compile_module(module, plan, out / "mixed", source="demo-cnn")
    console.print("[bold]2.[/] compiling the same model with IREE alone (the reference)")
    alone = compile_module(import_torch(model, [x], new_context()), "default", out / "iree-only", source="demo-cnn")

    xs = x.numpy()
    np.save(out / "x.npy", xs)
    with collage_runtime.load(mixed.out_dir) as prog:
        (y_mixed,) = prog.invoke("main", xs)
    with collage_runtime.load(alone.out_dir) as prog:
        (y_ref,) = prog.invoke("main", xs)
    tol = get_backend("onednn").tolerance
    ok = np.allclose(y_mixed, y_ref, rtol=tol.rtol, atol=tol.atol)
    err = float(np.max(np.abs(y_mixed - y_ref)))

    table = Table(title=f"placement (plan {mixed.plan.source})")
    for col in ("region", "backend", "ops"):
        table.add_column(col)
    for r in mixed.plan.regions:
        table.add_row(r.name, r.backend, ", ".join(map(str, sorted(r.ops))))
    table.add_row("(rest)", mixed.plan.default_backend, "every other op")
    console.print(table)
    console.print(f"mixed vs IREE alone: max |diff| = {err:.2e} (rtol {tol.rtol}, atol {tol.atol}) → "
                  + ("[green]MATCH" if ok else "[red]MISMATCH"))
    console.print(f"artifact: {mixed.out_dir} (run it: collage run {mixed.out_dir} --input {out / 'x.npy'})")
    return 0 if ok else 1
