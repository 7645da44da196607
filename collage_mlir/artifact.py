"""Compile driver: module + plan → artifact directory (IREE module, region artifacts, manifest).

    number ops → resolve + validate plan → assign → outline → lower (build regions) → place devices → iree-compile
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from collage_runtime.manifest import (MANIFEST, DeviceEntry, Manifest, RegionEntry, TailEntry, sha256_file,
                                      write_manifest)
from collage_runtime.package import SUFFIX as PACKAGE_SUFFIX
from collage_runtime.package import pack
from collage_runtime.shapes import SHAPES

from . import __version__
from .backends import get_backend, program_default
from .backends.iree_codegen import ProgramTarget, iree_compile
from .errors import CollageError
from .ir import ir
from .dialects import collage
from .passes import PassPipeline, partition_pipeline
from .passes.lower import library_regions
from .plan import Plan

MODULE_FILE = "main.vmfb"
TAIL_FILE = "tail.onnx"


@dataclass(frozen=True)
class CompileResult:
    out_dir: Path
    plan: Plan
    manifest: Manifest


@dataclass(frozen=True)
class Partitioned:
    """What the collage passes did to a module: the plan used, the library regions built (manifest
    entries), the program's devices, the IREE flags a second device needs and the program's target (its
    default backend's: platform and iree-compile flags)."""

    plan: Plan
    regions: tuple[RegionEntry, ...]
    devices: tuple[DeviceEntry, ...]
    iree_flags: tuple[str, ...]
    target: ProgramTarget


def partition(module: ir.Module, plan: Plan, artifact_dir: str | Path | None,
              iree_args: Sequence[str] = ()) -> Partitioned:
    """Runs the collage passes on ``module`` in place. ``plan`` is resolved already (plan strings such as
    ``random:7`` are the entry points' business: ``collage_mlir.search.resolve_plan``)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"partition takes a Plan, got {type(plan).__name__}; resolve plan strings first")
    target = program_default(plan.default_backend, where=plan.source).program_target(iree_args)
    # The default device's executable target follows the program's llvm-cpu flags.
    cpu_flags = [a for a in (*target.flags, *iree_args) if a.startswith("--iree-llvmcpu-")]
    # The same PassManager pipeline as `collage-opt --collage-partition`, so IR printing and timing
    # behave alike; the passes' results are read back from the IR.
    pipeline = PassPipeline(module.operation.context)
    for p in partition_pipeline(plan, Path(artifact_dir) if artifact_dir else None, tuple(cpu_flags),
                                target.kernel_arch):
        pipeline.add(p)
    pipeline.run(module)
    mod_op = module.operation
    devices = tuple(DeviceEntry.from_json(d, "collage.devices") for d in collage.json_attr(mod_op, collage.DEVICES, []))
    return Partitioned(plan, tuple(library_regions(module)), devices,
                       tuple(collage.json_attr(mod_op, collage.IREE_FLAGS, [])), target)


def compile_module(module: ir.Module, plan: Plan, out_dir: str | Path, *, source: str = "<module>",
                   iree_args: Sequence[str] = (), provenance: dict | None = None,
                   check: Callable[[Path], dict | None] | None = None, **iree_kwargs) -> CompileResult:
    """Partitions ``module`` by ``plan`` and writes the artifact directory ``out_dir`` (or, for a path
    ending in ``.collage``, one file packing that directory). ``provenance`` (where the plan came from:
    its tuning record, DB) is kept in the manifest for ``collage report``. ``check`` is called with the
    complete artifact directory before it is put in place: what it raises leaves ``out_dir`` as it was;
    what it returns (e.g. the program's agreement on held-out samples) joins the provenance.

    The artifact is built in a new directory beside ``out_dir`` and renamed into place once complete, so a
    failed or interrupted compile leaves the previous artifact as it was (or nothing), never a mix."""
    out = Path(out_dir)
    with staged(out) as stage:
        source_hash = hashlib.sha256(module.operation.get_asm(binary=True)).hexdigest()
        parts = partition(module, plan, stage, iree_args)
        # A second logical device (a codegen backend with its own configuration) needs program-wide flags.
        iree_args = [*parts.iree_flags, *iree_args]
        vmfb = iree_compile(module, iree_args, parts.target, **iree_kwargs)
        (stage / MODULE_FILE).write_bytes(vmfb)
        tail = collage.OnnxTail.of(module)
        if tail is not None:  # ONNX nodes run after main (frontends.onnx_tail)
            (stage / TAIL_FILE).write_bytes(tail.model)
            tail = TailEntry(TAIL_FILE, tail.inputs, tail.outputs, sha256_file(stage / TAIL_FILE))
        # The backends this artifact uses (asking every registered one imported torch in each compile).
        used = sorted({parts.plan.default_backend, *(r.backend for r in parts.plan.regions)})
        versions = {"collage-mlir": __version__, "python": sys.version.split()[0],
                    **{name: get_backend(name).version() for name in used}}
        manifest = Manifest(source, source_hash, MODULE_FILE, hashlib.sha256(vmfb).hexdigest(), versions,
                            (*parts.target.flags, *iree_args), parts.plan.to_json(), parts.devices,
                            tuple(replace(r, sha256=sha256_file(stage / r.artifact)) for r in parts.regions),
                            provenance or None, parts.target.platform, tail)
        write_manifest(stage, manifest)
        found = check(stage) if check is not None else None
        if found:
            manifest = replace(manifest, provenance={**(provenance or {}), **found})
            write_manifest(stage, manifest)
    return CompileResult(out, parts.plan, manifest)


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new directory beside ``out`` to build an artifact in; when the block ends it becomes ``out`` (a
    directory, or one packed ``.collage`` file), whole; a failure or an interrupt leaves ``out`` as it was.
    A file system error is one CollageError."""
    check_artifact_dir(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as exc:
        raise CollageError(f"cannot write the artifact here: {exc.strerror}", where=str(out)) from None
    try:
        yield stage
        if out.suffix == PACKAGE_SUFFIX:  # one deployable file
            pack(stage, out)
            shutil.rmtree(stage, ignore_errors=True)
        else:
            _replace_dir(stage, out)
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise CollageError(f"cannot write the artifact: {exc.strerror} ({exc.filename})", where=str(out)) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _replace_dir(new: Path, out: Path) -> None:
    """Puts the complete directory ``new`` at ``out``, moving an earlier artifact there out of the way."""
    if not out.exists():
        new.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    old.rmdir()
    out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def check_artifact_dir(out_dir: str | Path) -> None:
    """Refuses an output path that is a file, or a non-empty directory that holds no collage artifact
    (compiling replaces the whole directory)."""
    out = Path(out_dir)
    if out.suffix == PACKAGE_SUFFIX:
        if out.exists() and not zipfile.is_zipfile(out):
            raise CollageError(f"output path exists and is not a packed {PACKAGE_SUFFIX} artifact", where=str(out))
        return
    if out.exists() and not out.is_dir():
        raise CollageError("output path exists and is not a directory", where=str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file() and not (out / SHAPES).is_file():
        raise CollageError("output directory is not empty and holds no collage artifact; compiling replaces "
                           "the directory, so choose a new or empty one", where=str(out))
