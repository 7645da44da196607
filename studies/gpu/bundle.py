"""The bundle a GPU run reads: what ``prepare`` compiled here and what ``run`` measures there.

``BUNDLE/bundle.json`` is a ``Bundle``; every path in it is relative to the bundle directory. This module
imports only the standard library, so both sides read it (the GPU machine has no ``iree.compiler``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

BUNDLE_JSON = "bundle.json"
FORMAT = "collage-gpu-bundle"
VERSION = 1
#: Where prepare writes the dist-info registering the runtime's executors (``collage_runtime.executors``
#: entry points), for a machine where collage is not installed: ``run`` puts it on ``sys.path``.
SITE = "site"
WHEELS = "wheels"


@dataclass(frozen=True)
class PlanArtifact:
    """One compiled program of a model: the plan it was compiled with and where it lies."""

    plan: str              # the plan string: default, prefer:cudnn,cublas, ...
    artifact: str          # the artifact directory, relative to the bundle
    regions: int           # library regions in the program (0: the default backend alone)
    backends: tuple[str, ...]  # the backends of those regions, sorted, each once
    bytes: int             # the artifact's size on disk
    compile_s: float

    @staticmethod
    def from_json(d: dict) -> "PlanArtifact":
        return PlanArtifact(d["plan"], d["artifact"], int(d["regions"]), tuple(d["backends"]), int(d["bytes"]),
                            float(d["compile_s"]))


@dataclass(frozen=True)
class ModelSpec:
    """How both sides build the same torch model (seeded, eval mode): ``source`` ``zoo`` calls
    ``collage_mlir.zoo.build(name, small)``, ``tiny`` calls ``collage_mlir.zoo.tiny.<function>()``; with
    ``batch`` > 1 the example inputs are replaced by seeded random ones of that batch size."""

    source: str            # "zoo" or "tiny"
    name: str              # the zoo name, or the tiny builder's function name
    small: bool = True     # zoo only: the small (CI) variant
    batch: int = 1
    dtype: str = "f32"     # the model's weights and float inputs: f32 or f16

    @property
    def label(self) -> str:
        base = f"tiny.{self.name}" if self.source == "tiny" else self.name if self.small else f"{self.name}:full"
        base = base if self.dtype == "f32" else f"{base}+{self.dtype}"
        return base if self.batch == 1 else f"{base}@{self.batch}"

    @staticmethod
    def parse(text: str) -> "ModelSpec":
        """``mobilenet_v2`` (the zoo's small variant), ``mobilenet_v2:full``, ``tiny.mlp``; ``@N`` after any
        of them: batch N (``resnet50@32``)."""
        text, _, batch = text.partition("@")
        if batch and not (batch.isdigit() and int(batch) >= 1):
            raise ValueError(f"model '{text}@{batch}': the batch is a positive integer")
        n = int(batch or 1)
        text, _, dtype = text.partition("+")
        if dtype not in ("", "f32", "f16"):  # bf16: numpy has no type to carry its inputs in
            raise ValueError(f"model '{text}+{dtype}': the element type is f32 or f16")
        dtype = dtype or "f32"
        if text.startswith("tiny."):
            return ModelSpec("tiny", text[len("tiny."):], batch=n, dtype=dtype)
        name, _, variant = text.partition(":")
        if variant not in ("", "small", "full"):
            raise ValueError(f"model '{text}': the variant is small or full")
        return ModelSpec("zoo", name, variant != "full", n, dtype)

    @staticmethod
    def from_json(d: dict) -> "ModelSpec":
        return ModelSpec(d["source"], d["name"], bool(d["small"]), int(d.get("batch", 1)), d.get("dtype", "f32"))


@dataclass(frozen=True)
class ModelEntry:
    """A model of the bundle: how to rebuild it, its inputs and CPU reference outputs (``.npy``, made here
    with torch eager f32 on the CPU), and its compiled plans."""

    spec: ModelSpec
    function: str                 # the programs' public function
    inputs: tuple[str, ...]       # .npy files, in call order
    expected: tuple[str, ...]     # .npy files: torch eager f32 on the prepare machine's CPU
    plans: tuple[PlanArtifact, ...]

    @staticmethod
    def from_json(d: dict) -> "ModelEntry":
        return ModelEntry(ModelSpec.from_json(d["spec"]), d["function"], tuple(d["inputs"]), tuple(d["expected"]),
                          tuple(PlanArtifact.from_json(p) for p in d["plans"]))


@dataclass(frozen=True)
class Bundle:
    """Everything a run needs besides the repository tree: the programs, inputs, references and wheels."""

    device: str                   # "cuda" or "cpu": the programs' platform
    arch: str | None              # the CUDA architecture compiled for (sm_90), None on the CPU
    iree_version: str             # iree-base-compiler/runtime here: the runtime wheel is the same version
    torch_version: str            # torch that made the references
    created: str                  # UTC time
    models: tuple[ModelEntry, ...]
    wheels: tuple[str, ...]       # wheel files to install on the GPU machine (relative paths)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    @staticmethod
    def from_json(d: dict) -> "Bundle":
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} v{VERSION} file (format {d.get('format')!r}, version {d.get('version')!r})")
        return Bundle(d["device"], d["arch"], d["iree_version"], d["torch_version"], d["created"],
                      tuple(ModelEntry.from_json(m) for m in d["models"]), tuple(d["wheels"]))

    def save(self, root: Path) -> None:
        (root / BUNDLE_JSON).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(root: Path) -> "Bundle":
        path = root / BUNDLE_JSON
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no bundle here (run `python -m studies.gpu.prepare {root}` first)")
        return Bundle.from_json(json.loads(path.read_text()))


def build_model(spec: ModelSpec):
    """``(nn.Module in eval mode, example input tensors)`` for ``spec``, seeded: the same weights on every
    machine, in ``spec.dtype`` (float inputs too). Imports torch and ``collage_mlir.zoo`` (no IREE)."""
    import torch

    model, inputs = _build_f32(spec)
    if spec.dtype == "f32":
        return model, inputs
    return model.to(torch.float16), tuple(x.half() if x.is_floating_point() else x for x in inputs)


def _build_f32(spec: ModelSpec):
    import torch

    if spec.source == "zoo":
        from collage_mlir import zoo

        if zoo.get(spec.name).framework is not zoo.Framework.TORCH:
            raise ValueError(f"{spec.name}: a JAX model; this study compares against torch")
        model, inputs = zoo.build(spec.name, spec.small)
        return model, batched(tuple(inputs), spec.batch)
    if spec.source == "tiny":
        from collage_mlir.zoo import tiny

        built = getattr(tiny, spec.name)()
        if isinstance(built, tuple):
            model, inputs = built
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        else:
            model = built
            inputs = (torch.randn(*TINY_INPUTS[spec.name], generator=torch.Generator().manual_seed(1)),)
        return model.eval(), batched(inputs, spec.batch)
    raise ValueError(f"unknown model source '{spec.source}' (zoo or tiny)")


def batched(inputs: tuple, batch: int) -> tuple:
    """``inputs`` with batch ``batch`` (dimension 0): seeded standard-normal floats, integer inputs (token
    ids) as their example's rows in a seeded random order; the examples themselves for batch 1."""
    import torch

    if batch == 1:
        return inputs
    g = torch.Generator().manual_seed(2)
    out = []
    for x in inputs:
        if not x.is_floating_point():
            rows = torch.randint(0, x.shape[0], (batch,), generator=g)
            out.append(torch.stack([x[r][torch.randperm(x.shape[1], generator=g)] if x.dim() > 1 else x[r]
                                    for r in rows.tolist()]))
            continue
        out.append(torch.randn((batch, *x.shape[1:]), generator=g, dtype=x.dtype))
    return tuple(out)


#: Input shapes of the tiny builders that return a module alone.
TINY_INPUTS = {"mlp": (4, 32), "small_cnn": (1, 3, 32, 32)}
