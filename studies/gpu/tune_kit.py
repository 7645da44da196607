"""The kit `tune_on_gpu.sh` carries to a GPU machine: IREE's compiler and runtime for CPython 3.12 (the
compiler's library stripped of its symbol tables and xz-packed: 336 MB -> ~35 MB, so that it fits with the
tree in a device call's 64 MiB), a dist-info registering collage's entry points (collage is not installed
there), and the models as StableHLO (xz-packed) with their inputs and IREE CPU outputs (the reference the
compiled program is checked against). Full-size torch models (``resnet50:full``) get packable weights
(``packable_weights``): a full-size model travels in a MiB or two, and the GPU machine rebuilds the same torch
model to time it against (``tuned_vs_torch.py``).

    python -m studies.gpu.tune_kit build/gpu_tune [--models resnet50,jax_bert_base,resnet50:full] [--models-only]
        [--kernels triton,triton@32x64w4s4]

``--kernels`` compiles, here, every kernel those kernel backends could run in each model's candidate regions
(``kernel_cache.py``) into ``kernels.tar.xz``, which ``tune_on_gpu.sh`` unpacks into the tune's kernel cache:
the GPU machine's tune then compiles only what this missed, with its own Triton.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import distribution, version
from pathlib import Path

import numpy as np

from collage_mlir import zoo

from .bundle import ModelSpec, build_model
from .prepare import download_wheels

MODELS = ("resnet50", "jax_bert_base", "resnet50:full", "mobilenet_v2:full")
#: What the GPU machine needs of the runtime wheel (the tracy builds and the tools are 30 MB more).
RUNTIME_DROP = ("iree/_runtime_libs_tracy/",)
RUNTIME_KEEP_TOOLS = ("iree-run-module", "iree-dump-module", "iree-cpuinfo")
COMPILER_LIB = "iree/compiler/_mlir_libs/libIREECompiler.so"


def _unpack(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if name.startswith(RUNTIME_DROP):
                continue
            if name.startswith("iree/_runtime_libs/iree-") and Path(name).name not in RUNTIME_KEEP_TOOLS:
                continue
            z.extract(info, into)
            if (info.external_attr >> 16) & 0o111:
                (into / name).chmod(0o755)


DIST_INFO = "collage_mlir-0.1.0.dist-info"


def write_site(kit: Path, work: Path) -> None:
    """``kit/site.tar.xz`` (runtime, compiler without its library, collage's dist-info) and
    ``kit/libIREECompiler.so.xz``."""
    wheels = work / "wheels"
    found = download_wheels(wheels, [f"iree-base-runtime=={version('iree-base-runtime')}",
                                     f"iree-base-compiler=={version('iree-base-compiler')}"])
    site = work / "site"
    for wheel in found:
        _unpack(wheel, site)
    lib = site / COMPILER_LIB
    subprocess.run(["strip", "--strip-unneeded", str(lib)], check=True)
    with open(kit / "libIREECompiler.so.xz", "wb") as out:
        subprocess.run(["xz", "-9e", "-T0", "-c", str(lib)], stdout=out, check=True)
    lib.unlink()
    subprocess.run(["tar", "cJf", str(kit / "site.tar.xz"), "-C", str(site), "."], check=True)


def write_dist_info(kit: Path) -> None:
    """``kit/collage_mlir-0.1.0.dist-info``: collage's entry points (its backends) as this tree registers
    them, rewritten with every kit (a kit whose IREE wheels were kept still gets today's backends);
    ``tune_on_gpu.sh`` puts it on the path beside IREE."""
    info = kit / DIST_INFO
    shutil.rmtree(info, ignore_errors=True)
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: collage-mlir\nVersion: 0.1.0\n")
    info.joinpath("entry_points.txt").write_text(distribution("collage-mlir").read_text("entry_points.txt"))


def packable_weights(model, inputs, period: int = 4093) -> None:
    """Every weight matrix and kernel of ``model`` (in place) to three values, ``{-s, 0, s}`` with ``s`` its
    standard deviation, repeating with a prime ``period`` along the flattened tensor (the first ``period``
    values of its seeded random weights, again and again), then the batch norms recalibrated: xz packs such
    weights to almost nothing (a full BERT-base, 110 M weights, travels in about a MiB) while no row or
    column of a matrix equals another (the period divides no dimension). Timings do not depend on the values;
    deterministic, so the GPU machine rebuilds the same model from the zoo's seed."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                s = p.std()
                flat = p.reshape(-1)
                head = flat[:period].clone()
                tiled = head.repeat((flat.numel() + period - 1) // period)[:flat.numel()]
                p.copy_((torch.sign(tiled) * (tiled.abs() > s / 2) * s).reshape(p.shape))
    torch.manual_seed(zoo.SEED)
    zoo.calibrate_batch_norm(model, inputs)


def kit_model(spec: ModelSpec):
    """``(model, example inputs)`` of a kit's model: a zoo small variant as the zoo builds it; a full-size
    torch model with packable weights."""
    if spec.small or zoo.get(spec.name).framework is not zoo.Framework.TORCH:
        return zoo.build(spec.name, spec.small)
    model, inputs = build_model(spec)
    packable_weights(model, inputs)
    return model, inputs


def stem(spec: ModelSpec) -> str:
    return spec.label.replace(":", "_").replace("@", "_b")


def write_kernels(kit: Path, backends: list[str], arch: str = "sm_90") -> None:
    """``kit/kernels.tar.xz``: the kernel cache of every candidate of ``backends`` in the kit's models."""
    import os

    from .kernel_cache import precompile

    with tempfile.TemporaryDirectory() as work:
        os.environ["COLLAGE_CACHE_DIR"] = work
        for stem_ in (kit / "models.txt").read_text().split():
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{stem_}.mlir"
                with open(path, "wb") as out:
                    subprocess.run(["xz", "-d", "-c", str(kit / f"{stem_}.mlir.xz")], stdout=out, check=True)
                done, failed = precompile(path, backends, arch)
            print(f"{stem_}: {done} kernel regions ({failed} failed)")
        subprocess.run(["tar", "cJf", str(kit / "kernels.tar.xz"), "-C", work, "kernels"], check=True)
    print(f"kernels: {(kit / 'kernels.tar.xz').stat().st_size / 2**20:.1f} MiB packed")


def write_models(kit: Path, models: list[str]) -> None:
    """Each model's ``STEM.mlir.xz``, inputs ``STEM.inK.npy`` and IREE CPU outputs ``ref_STEM/out_K.npy``;
    ``models.txt`` (the stems) and ``torch_models.txt`` (``STEM SPEC`` of the torch models, whose peers
    the GPU machine can time)."""
    from iree.compiler import ir

    from collage_mlir.frontends.jax import import_jax
    from collage_mlir.frontends.torch import import_torch

    stems, torch_lines = [], []
    for text in models:
        spec = ModelSpec.parse(text)
        name = stem(spec)
        model, example = kit_model(spec)
        is_torch = zoo.get(spec.name).framework is zoo.Framework.TORCH
        module = (import_torch if is_torch else import_jax)(model, example, ir.Context(), cache=False)
        with tempfile.TemporaryDirectory() as art:
            path = Path(art) / f"{name}.mlir"
            path.write_text(str(module))
            inputs = []
            for k, x in enumerate(example):
                np.save(kit / f"{name}.in{k}.npy", np.asarray(x.numpy() if hasattr(x, "numpy") else x))
                inputs += ["--input", str(kit / f"{name}.in{k}.npy")]
            cli = [sys.executable, "-m", "collage_mlir.tools.cli"]
            subprocess.run([*cli, "compile", str(path), "--plan", "default", "-o", f"{art}/a", *inputs], check=True)
            subprocess.run([*cli, "run", f"{art}/a", *inputs, "--output-dir", str(kit / f"ref_{name}")], check=True)
            with open(kit / f"{name}.mlir.xz", "wb") as out:
                subprocess.run(["xz", "-9", "-T0", "-c", str(path)], stdout=out, check=True)
        stems.append(name)
        if is_torch:
            torch_lines.append(f"{name} {spec.label}")
        print(f"{name}: {(kit / f'{name}.mlir.xz').stat().st_size / 2**20:.1f} MiB packed")
    (kit / "models.txt").write_text(" ".join(stems) + "\n")
    (kit / "torch_models.txt").write_text("".join(f"{line}\n" for line in torch_lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kit", type=Path)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="zoo names (small variants) or NAME:full (torch models: packable weights)")
    parser.add_argument("--models-only", action="store_true", help="keep the kit's IREE wheels, remake the models")
    parser.add_argument("--kernels", help="kernel backends whose kernels to compile here (e.g. triton,triton@*)")
    parser.add_argument("--kernels-only", action="store_true", help="keep the kit, remake kernels.tar.xz")
    args = parser.parse_args(argv)
    if args.kernels_only:
        write_kernels(args.kit, args.kernels.split(","))
        write_dist_info(args.kit)
        return 0
    args.kit.mkdir(parents=True, exist_ok=True)
    if not (args.models_only and (args.kit / "site.tar.xz").exists()):
        with tempfile.TemporaryDirectory() as work:
            write_site(args.kit, Path(work))
    write_dist_info(args.kit)
    for old in [*args.kit.glob("*.mlir*"), *args.kit.glob("*.npy")]:
        old.unlink()
    for old in args.kit.glob("ref_*"):
        shutil.rmtree(old)
    write_models(args.kit, args.models.split(","))
    if args.kernels:
        write_kernels(args.kit, args.kernels.split(","))
    total = sum(p.stat().st_size for p in args.kit.rglob("*") if p.is_file())
    print(f"kit: {total / 2**20:.1f} MiB in {args.kit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
