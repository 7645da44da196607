"""Prepares a GPU bundle on this (CPU) machine: compiles each model once per plan for the GPU machine,
writes its inputs and CPU reference outputs, the dist-info that registers the runtime's executors, and
downloads the ``iree-base-runtime`` wheel for the GPU machine's Python.

    python -m studies.gpu.prepare build/gpu_bundle --arch sm_90                      # CUDA (the default)
    python -m studies.gpu.prepare /tmp/b --device cpu --models tiny.mlp --no-wheel  # what CI runs
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import distribution, version
from pathlib import Path

import numpy as np

from .bundle import SITE, WHEELS, Bundle, ModelEntry, ModelSpec, PlanArtifact, build_model

#: Plans per device, in order; a plan that resolves to the same placement as an earlier one is dropped.
PLANS = {"cuda": ("default", "prefer:cudnn,cublas", "prefer:cublas", "prefer:cudnn"),
         "cpu": ("default", "prefer:onednn")}
#: Small zoo variants: each compiles in about a minute per plan here and is 0.2-2 MiB per artifact.
DEFAULT_MODELS = ("mobilenet_v2", "resnet50", "dcgan")
#: What the bundle may weigh: the repository tree travels to the GPU machine with it (64 MiB in all).
BUDGET_MIB = 45.0
#: The GPU machine's Python and platforms (manylinux tags its wheels are built for).
GPU_PYTHON = "3.12"
GPU_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
EXECUTOR_GROUP = "collage_runtime.executors"


class OverBudget(Exception):
    """The bundle outgrew its budget."""


def size_of(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def download_wheels(wheels: Path, requirements: list[str], deps: bool = False) -> list[Path]:
    """Wheels of ``requirements`` (with their dependencies when ``deps``) for the GPU machine's CPython,
    downloaded with pip into ``wheels``; returns every wheel there."""
    wheels.mkdir(parents=True, exist_ok=True)
    target = ["--only-binary=:all:", "--python-version", GPU_PYTHON, "--implementation", "cp",
              *[a for p in GPU_PLATFORMS for a in ("--platform", p)], "-d", str(wheels)]
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *([] if deps else ["--no-deps"]), *target, *requirements], check=True)
    return sorted(wheels.glob("*.whl"))


def download_runtime_wheel(wheels: Path, with_pytest: bool) -> list[Path]:
    """The ``iree-base-runtime`` wheel of the version installed here (and pytest's, with its dependencies,
    when asked: pure-Python wheels; the GPU machine may have no pytest)."""
    download_wheels(wheels, [f"iree-base-runtime=={version('iree-base-runtime')}"])
    if with_pytest:
        download_wheels(wheels, [f"pytest=={version('pytest')}"], deps=True)
    return sorted(wheels.glob("*.whl"))


def write_executor_site(site: Path) -> None:
    """A dist-info registering the runtime's executors (the ``collage_runtime.executors`` entry points of
    the collage install here), so a machine that has the repository tree but no collage install finds them
    with ``site`` on ``sys.path``."""
    eps = [ep for ep in distribution("collage-mlir").entry_points if ep.group == EXECUTOR_GROUP]
    if not eps:
        raise SystemExit("prepare: the collage install here registers no runtime executors (pip install -e .)")
    info = site / "collage_gpu_bundle_executors-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: collage-gpu-bundle-executors\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{EXECUTOR_GROUP}]\n" + "".join(f"{ep.name} = {ep.value}\n" for ep in eps))


def reference_outputs(model, inputs) -> list[np.ndarray]:
    """torch eager f32 on this machine's CPU: what the GPU side's rebuilt model must reproduce."""
    import torch

    with torch.inference_mode():
        out = model(*inputs)
    return [t.detach().float().numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def resolved_plans(spec: ModelSpec, plans: tuple[str, ...], platform) -> list[tuple[str, object]]:
    """``(plan string, Plan)`` for each of ``plans`` whose placement differs from every earlier one's."""
    from collage_mlir.graph import Graph, number_ops
    from collage_mlir.search import resolve_plan

    module = import_module(spec)
    number_ops(module)
    graph, seen, kept = Graph(module), set(), []
    for text in plans:
        plan = resolve_plan(text, graph, platform)
        if plan.key not in seen:
            seen.add(plan.key)
            kept.append((text, plan))
    return kept


def import_module(spec: ModelSpec):
    """The model as StableHLO (``@main``), from the torch frontend's on-disk cache when there."""
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.ir import new_context

    model, inputs = build_model(spec)
    return import_torch(model, inputs, new_context())


def compile_plan(spec: ModelSpec, text: str, plan, out: Path, platform, iree_args: list[str]) -> PlanArtifact:
    """Compiles the model with ``plan`` into ``out``; the artifact's entry (path relative to the bundle)."""
    from collage_mlir.iree import compile_module

    start = time.perf_counter()
    result = compile_module(import_module(spec), plan, out, platform=platform, iree_args=iree_args)
    regions = result.manifest.regions
    return PlanArtifact(text, "", len(regions), tuple(sorted({r.backend for r in regions})), size_of(out),
                        round(time.perf_counter() - start, 1))


def prepare_model(spec: ModelSpec, root: Path, plans: tuple[str, ...], platform, iree_args: list[str],
                  budget: int) -> ModelEntry:
    """Inputs, references and one artifact per distinct plan of ``spec`` under ``root/models/<label>``;
    raises OverBudget as soon as the bundle outgrows ``budget`` bytes."""
    model, inputs = build_model(spec)
    folder = root / "models" / spec.label.replace(":", "_")
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k, x in enumerate(inputs):
        np.save(folder / f"input_{k}.npy", x.detach().numpy())
        names.append(f"input_{k}.npy")
    expected = []
    for k, y in enumerate(reference_outputs(model, inputs)):
        np.save(folder / f"expected_{k}.npy", y)
        expected.append(f"expected_{k}.npy")
    rel = folder.relative_to(root)
    artifacts = []
    for text, plan in resolved_plans(spec, plans, platform):
        out = folder / text.replace(":", "_").replace(",", "_")
        art = compile_plan(spec, text, plan, out, platform, iree_args)
        art = PlanArtifact(art.plan, str(out.relative_to(root)), art.regions, art.backends, art.bytes, art.compile_s)
        total = size_of(root)
        print(f"  {spec.label} {text}: {art.bytes / 2**20:.2f} MiB, {art.regions} library regions "
              f"{','.join(art.backends) or '-'}, compiled in {art.compile_s:.0f} s (bundle {total / 2**20:.1f} MiB)",
              flush=True)
        if total > budget:
            raise OverBudget(f"the bundle is {total / 2**20:.1f} MiB after {spec.label} {text}, over the "
                             f"{budget / 2**20:.0f} MiB budget: pick small variants or fewer models/plans")
        artifacts.append(art)
    return ModelEntry(spec, "main", tuple(f"{rel}/{n}" for n in names), tuple(f"{rel}/{n}" for n in expected),
                      tuple(artifacts))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path, help="the bundle directory (replaced)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--arch", default="sm_90", help="CUDA architecture (default sm_90: H100/H200)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated: zoo names (small variant), NAME:full, tiny.mlp / tiny.small_cnn / ...")
    p.add_argument("--plans", help=f"comma-separated with ';' between plans (default: {'; '.join(PLANS['cuda'])})")
    p.add_argument("--budget-mib", type=float, default=BUDGET_MIB)
    p.add_argument("--no-wheel", action="store_true", help="download no wheel (CI, or a CPU bundle)")
    p.add_argument("--no-pytest-wheel", action="store_true", help="download iree-base-runtime only, not pytest")
    args = p.parse_args(argv)

    from collage_runtime.types import Platform

    platform = Platform.CUDA if args.device == "cuda" else Platform.CPU
    iree_args = [f"--iree-cuda-target={args.arch}"] if args.device == "cuda" else []
    plans = tuple(s.strip() for s in args.plans.split(";")) if args.plans else PLANS[args.device]
    try:
        specs = [ModelSpec.parse(m.strip()) for m in args.models.split(",") if m.strip()]
    except ValueError as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 2
    root, budget = args.bundle, int(args.budget_mib * 2**20)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    write_executor_site(root / SITE)
    wheels: list[Path] = []
    if not args.no_wheel:
        wheels = download_runtime_wheel(root / WHEELS, not args.no_pytest_wheel)
        for w in wheels:
            print(f"  wheel {w.name}: {w.stat().st_size / 2**20:.2f} MiB", flush=True)
    entries = []
    try:
        for spec in specs:
            entries.append(prepare_model(spec, root, plans, platform, iree_args, budget))
    except OverBudget as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 1
    import torch

    bundle = Bundle(args.device, args.arch if args.device == "cuda" else None, version("iree-base-runtime"),
                    torch.__version__, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), tuple(entries),
                    tuple(str(w.relative_to(root)) for w in wheels))
    bundle.save(root)
    print(f"bundle {root}: {size_of(root) / 2**20:.1f} MiB, {len(entries)} model(s), "
          f"{sum(len(e.plans) for e in entries)} artifact(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
