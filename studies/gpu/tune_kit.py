"""The kit `tune_on_gpu.sh` carries to a GPU machine: IREE's compiler and runtime for CPython 3.12 (the
compiler's library stripped of its symbol tables and xz-packed: 336 MB -> ~35 MB, so that it fits with the
tree in a device call's 64 MiB), a dist-info registering collage's entry points (collage is not installed
there), and the models as StableHLO with their inputs and IREE CPU outputs (the reference the
compiled program is checked against).

    python -m studies.gpu.tune_kit build/gpu_tune [--models resnet50,mobilenet_v2,jax_bert_base]
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

from .prepare import download_wheels

MODELS = ("resnet50", "mobilenet_v2", "jax_bert_base")
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
    info = site / "collage_mlir-0.1.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: collage-mlir\nVersion: 0.1.0\n")
    info.joinpath("entry_points.txt").write_text(distribution("collage-mlir").read_text("entry_points.txt"))
    subprocess.run(["tar", "cJf", str(kit / "site.tar.xz"), "-C", str(site), "."], check=True)


def write_models(kit: Path, models: list[str]) -> None:
    """Each model's ``.mlir``, inputs ``NAME.inK.npy`` and IREE CPU outputs ``ref_NAME/out_K.npy``."""
    from iree.compiler import ir

    for name in models:
        path = kit / f"{name}.mlir"
        path.write_text(str(zoo.import_stablehlo(name, ir.Context(), small=True)))
        inputs = []
        for k, x in enumerate(zoo.numpy_inputs(name, small=True)):
            np.save(kit / f"{name}.in{k}.npy", x)
            inputs += ["--input", str(kit / f"{name}.in{k}.npy")]
        with tempfile.TemporaryDirectory() as art:
            cli = [sys.executable, "-m", "collage_mlir.tools.cli"]
            subprocess.run([*cli, "compile", str(path), "--plan", "default", "-o", art, *inputs], check=True)
            subprocess.run([*cli, "run", art, *inputs, "--output-dir", str(kit / f"ref_{name}")], check=True)
        print(f"{name}: {path.stat().st_size / 2**20:.1f} MiB")
    (kit / "models.txt").write_text(" ".join(models) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kit", type=Path)
    parser.add_argument("--models", default=",".join(MODELS), help="zoo names (small variants)")
    args = parser.parse_args(argv)
    args.kit.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        write_site(args.kit, Path(work))
    write_models(args.kit, args.models.split(","))
    total = sum(p.stat().st_size for p in args.kit.rglob("*") if p.is_file())
    print(f"kit: {total / 2**20:.1f} MiB in {args.kit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
