"""What a GPU run writes: ``OUT/results.json`` (a ``Results``) and ``OUT/results.md`` (its tables). Standard
library only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = "collage-gpu-results"
VERSION = 1


@dataclass(frozen=True)
class Environment:
    device: str            # "cuda" or "cpu"
    device_name: str       # torch's name of the GPU, or the CPU model
    capability: str | None  # sm_90
    driver: str | None     # the NVIDIA driver (nvidia-smi)
    python: str
    torch: str
    cuda: str | None       # torch's CUDA runtime
    cudnn: str | None
    iree_runtime: str
    bundle_arch: str | None
    bundle_created: str

    @staticmethod
    def from_json(d: dict) -> "Environment":
        return Environment(**d)


@dataclass(frozen=True)
class TestRun:
    """``pytest -m gpu`` on the files that hold gpu-marked tests."""

    command: str
    files: tuple[str, ...]
    passed: int
    failed: int
    skipped: int
    errors: int
    rc: int | None         # None: pytest did not run (see summary)
    summary: str           # pytest's last line, or why it did not run
    seconds: float

    @staticmethod
    def from_json(d: dict) -> "TestRun":
        return TestRun(**{**d, "files": tuple(d["files"])})


@dataclass(frozen=True)
class PlanCheck:
    """One program's outputs against torch eager on the same device (and the load it took)."""

    plan: str
    regions: int
    backends: tuple[str, ...]
    load_s: float | None
    max_error: float | None  # max |program - eager| / max |eager|, over all outputs; None: did not run
    passed: bool
    note: str                # why it failed, or ""

    @staticmethod
    def from_json(d: dict) -> "PlanCheck":
        return PlanCheck(**{**d, "backends": tuple(d["backends"])})


@dataclass(frozen=True)
class Timing:
    """One contender's interleaved timing: ``median_ms`` of ``samples`` samples (each the mean of ``inner``
    synchronised calls); ``status`` is ``ok`` or why there is no figure."""

    contender: str         # "collage default", "collage prefer:cudnn,cublas", "torch eager", "torch.compile"
    kind: str              # "collage" or "peer"
    median_ms: float | None
    min_ms: float | None
    samples: int
    inner: int
    compile_s: float | None  # torch.compile's first call
    status: str

    @staticmethod
    def from_json(d: dict) -> "Timing":
        return Timing(**d)


@dataclass(frozen=True)
class ModelResult:
    model: str
    reference_error: float | None  # rebuilt torch eager on the device vs the bundle's CPU reference
    reference_ok: bool
    checks: tuple[PlanCheck, ...]
    timings: tuple[Timing, ...]
    best_collage: str | None
    best_peer: str | None
    speedup: float | None          # best peer median / best collage median
    mix_over_default: float | None  # collage default median / best library-mix plan's median
    complete: bool                 # False: stopped early, or a step failed (see notes)
    notes: tuple[str, ...]

    @property
    def numerics_ok(self) -> bool:
        return self.reference_ok and bool(self.checks) and all(c.passed for c in self.checks)

    @staticmethod
    def from_json(d: dict) -> "ModelResult":
        return ModelResult(d["model"], d["reference_error"], d["reference_ok"],
                           tuple(PlanCheck.from_json(c) for c in d["checks"]),
                           tuple(Timing.from_json(t) for t in d["timings"]), d["best_collage"], d["best_peer"],
                           d["speedup"], d["mix_over_default"], d["complete"], tuple(d["notes"]))


@dataclass(frozen=True)
class Results:
    environment: Environment
    tolerance: float
    seconds_per_model: float
    tests: TestRun | None
    models: tuple[ModelResult, ...]
    stopped_early: str | None  # why the run stopped before the end, or None
    elapsed_s: float

    @property
    def numerics_ok(self) -> bool:
        return bool(self.models) and all(m.numerics_ok for m in self.models)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **asdict(self), "numerics_ok": self.numerics_ok}

    @staticmethod
    def from_json(d: dict) -> "Results":
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} v{VERSION} file")
        return Results(Environment.from_json(d["environment"]), d["tolerance"], d["seconds_per_model"],
                       TestRun.from_json(d["tests"]) if d["tests"] else None,
                       tuple(ModelResult.from_json(m) for m in d["models"]), d["stopped_early"], d["elapsed_s"])

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(self.to_json(), indent=1) + "\n")
        (out / "results.md").write_text(markdown(self))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _err(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def markdown(r: Results) -> str:
    e = r.environment
    lines = ["# collage on the GPU: numerics and timings", "",
             f"- device: {e.device_name} ({e.device}{', ' + e.capability if e.capability else ''}), driver {e.driver or '-'}",
             f"- torch {e.torch}, CUDA {e.cuda or '-'}, cuDNN {e.cudnn or '-'}, IREE runtime {e.iree_runtime}, Python {e.python}",
             f"- bundle: {e.bundle_arch or 'cpu'}, made {e.bundle_created}; tolerance: max |program - torch eager| "
             f"<= {r.tolerance:g} x max |torch eager| (f32, TF32 off)",
             f"- timing: interleaved rounds, inputs already on the device, warm-up first, median; "
             f"{r.seconds_per_model:g} s per model; run took {r.elapsed_s:.0f} s",
             f"- numerics: {'all passed' if r.numerics_ok else 'FAILED (see below)'}"]
    if r.stopped_early:
        lines.append(f"- **stopped early**: {r.stopped_early}")
    if r.tests is not None:
        t = r.tests
        lines.append(f"- `{t.command}`: {t.passed} passed, {t.failed} failed, {t.skipped} skipped, {t.errors} errors "
                     f"({t.summary})")
    for m in r.models:
        lines += ["", f"## {m.model}", "",
                  f"Reference: rebuilt torch eager vs the bundle's CPU output: error {_err(m.reference_error)} "
                  f"({'ok' if m.reference_ok else 'MISMATCH'}).", "",
                  "| plan | library regions | load s | max error | check |", "|---|---:|---:|---:|---|"]
        for c in m.checks:
            lines.append(f"| {c.plan} | {c.regions} {','.join(c.backends)} | {_ms(c.load_s)} | "
                         f"{_err(c.max_error)} | "
                         f"{'pass' if c.passed else 'FAIL ' + c.note} |")
        lines += ["", "| contender | median ms | min ms | samples x calls | compile s | status |",
                  "|---|---:|---:|---:|---:|---|"]
        for t in m.timings:
            lines.append(f"| {t.contender} | {_ms(t.median_ms)} | {_ms(t.min_ms)} | {t.samples} x {t.inner} | "
                         f"{'-' if t.compile_s is None else f'{t.compile_s:.1f}'} | {t.status} |")
        lines.append("")
        if m.speedup is not None:
            lines.append(f"Best collage plan **{m.best_collage}** vs best peer **{m.best_peer}**: "
                         f"**{m.speedup:.2f}x**" + (f"; best library mix over IREE alone: {m.mix_over_default:.2f}x"
                                                    if m.mix_over_default is not None else "") + ".")
        for n in m.notes:
            lines.append(f"- {n}")
    return "\n".join(lines) + "\n"
