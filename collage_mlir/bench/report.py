"""A bench run's results as JSON (the data), a markdown table and a PNG chart (matplotlib)."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from collage_runtime.profile import Breakdown

from ..errors import CollageError
from .contenders import COLLAGE, CONTENDERS
from .session import BenchResult, ModelResult, Status

#: Packages whose versions a result records.
PACKAGES = ("collage-mlir", "iree-base-compiler", "iree-base-runtime", "torch", "torch-mlir", "onnx", "onnxscript",
            "onnxruntime", "openvino", "jax", "jaxlib", "transformers")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            found[p] = version(p)
        except PackageNotFoundError:
            pass
    return found


def machine() -> str:
    """CPU model and the CPUs this process may use."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs"


def peers(result: BenchResult) -> list[str]:
    return [n for n in result.contenders if n != COLLAGE]


def geomean_ratio(result: BenchResult) -> float | None:
    """Geometric mean over models of collage's speedup over the best peer (models without one left out)."""
    ratios = [r for m in result.models if (r := m.ratio(COLLAGE, peers(result))) is not None]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def to_json(result: BenchResult, command: str) -> dict:
    def plain(obj):
        if isinstance(obj, Enum):
            return obj.value
        if isinstance(obj, dict):
            return {k: plain(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [plain(v) for v in obj]
        return obj

    models = []
    for m in result.models:
        best = m.best(peers(result))
        fastest = m.best(result.contenders)
        models.append(plain(asdict(m)) | {
            "best_peer": best.name if best else None,
            "ratio_to_best_peer": m.ratio(COLLAGE, peers(result)),
            "best_gflops": m.gflop / (fastest.median_ms / 1e3) if fastest else None})
    return {"benchmark": "collage bench", "command": command, "machine": machine(), "versions": versions(),
            "options": asdict(result.options), "contenders": result.contenders,
            "geomean_ratio_to_best_peer": geomean_ratio(result), "models": models}


def from_json(doc: dict) -> BenchResult:
    """A result written by ``to_json`` (for merging the models of several runs into one report)."""
    from dataclasses import fields

    from .session import BenchOptions, ContenderResult

    options = BenchOptions(**{f.name: doc["options"][f.name] for f in fields(BenchOptions) if f.name in doc["options"]})
    models = []
    for m in doc["models"]:
        contenders = [ContenderResult(**(c | {"status": Status(c["status"])})) for c in m["contenders"]]
        models.append(ModelResult(m["model"], m["description"], m["gflop"], contenders, tuple(m["load_avg"]),
                                  m.get("import_s"), m.get("timed_at", ""), m.get("breakdown"),
                                  m.get("plan") or options.plan))
    return BenchResult(options, doc["contenders"], models)


def merge(docs: list[dict]) -> BenchResult:
    """One result holding every model of ``docs`` (runs with the same contenders and thread count)."""
    results = [from_json(d) for d in docs]
    first = results[0]
    for r in results[1:]:
        if r.contenders != first.contenders or r.options.threads != first.options.threads:
            raise CollageError("merged bench results must have the same contenders and --threads")
        first.models += r.models
    return first


def _cell(m: ModelResult, name: str, bold: bool) -> str:
    c = m.result(name)
    if c is None:
        return ""
    if c.status is Status.FAILED:
        return "failed"
    text = f"{c.median_ms:.3g} ±{100 * c.spread:.0f}%" if c.median_ms is not None else "—"
    if c.status is Status.WRONG:
        return f"~~{text}~~ wrong"
    return f"**{text}**" if bold else text


def to_markdown(result: BenchResult, command: str) -> str:
    o = result.options
    plans = list(dict.fromkeys(m.plan or o.plan for m in result.models)) or [o.plan]
    plan_text = (f"collage plan `{plans[0]}`" if len(plans) == 1 else "collage plan per model: " + ", ".join(
        f"{m.model} `{m.plan or o.plan}`" for m in result.models))
    lines = [f"# collage bench{' (small models)' if o.small else ''}", "",
             f"`{command}`", "",
             f"{machine()}; {o.threads} threads per contender; {plan_text}; "
             f"numerics within {o.rtol:g} x max|ref| of the reference (PyTorch eager; `jax.jit` for JAX models).", "",
             "Median ms per inference ±(p75-p25)/median; **bold**: best peer; ratio: best peer / collage "
             "(>1: collage faster); ~~struck~~: outputs wrong, not ranked.", "",
             "Contenders: " + "; ".join(f"`{n}` {CONTENDERS[n].description}" for n in result.contenders
                                        if n in CONTENDERS) + ".", ""]
    names = result.contenders
    lines.append("| model | GFLOP | " + " | ".join(names) + " | best peer | collage ratio | best GFLOP/s |")
    lines.append("|---|---:|" + "---:|" * len(names) + "---|---:|---:|")
    for m in result.models:
        best = m.best(peers(result))
        fastest = m.best(names)
        ratio = m.ratio(COLLAGE, peers(result))
        cells = [_cell(m, n, best is not None and n == best.name) for n in names]
        gflops = f"{m.gflop / (fastest.median_ms / 1e3):.1f} ({fastest.name})" if fastest else "—"
        lines.append(f"| {m.model} | {m.gflop:.3g} | " + " | ".join(cells)
                     + f" | {best.name if best else '—'} | {f'{ratio:.2f}x' if ratio else '—'} | {gflops} |")
    g = geomean_ratio(result)
    lines += ["", f"Geomean of collage over the best peer: **{g:.2f}x**" if g else "Geomean: no model has a ratio.", ""]
    lines += ["Compile time (s, from nothing to the first result; the StableHLO import, done once before, is not "
              "counted: " + ", ".join(f"{m.model} {m.import_s:.1f} s" for m in result.models if m.import_s is not None)
              + "):",
              "", "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for m in result.models:
        lines.append(f"| {m.model} | " + " | ".join(
            f"{c.compile_s:.1f}" if c and c.compile_s is not None else "—" for c in map(m.result, names)) + " |")
    lines += ["", "Largest error vs the reference (relative to the output's largest magnitude):", "",
              "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for m in result.models:
        lines.append(f"| {m.model} | " + " | ".join(
            f"{c.max_rel_err:.1e}" if c and c.max_rel_err is not None else "—" for c in map(m.result, names)) + " |")
    if any(c.rss_mb is not None for m in result.models for c in m.contenders):
        lines += ["", "Memory held by each contender's worker once set up, GB (peak in brackets; compiles run in a "
                  "child process and are not counted):", "",
                  "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for m in result.models:
            lines.append(f"| {m.model} | " + " | ".join(
                f"{c.rss_mb / 1024:.2f} ({c.peak_rss_mb / 1024:.2f})" if c and c.rss_mb is not None else "—"
                for c in map(m.result, names)) + " |")
    notes = [f"- {m.model} / {c.name}: {c.status.value}: {c.message}" for m in result.models for c in m.contenders
             if c.status is not Status.OK]
    if notes:
        lines += ["", "Failed or wrong:", "", *notes]
    lines += ["", "Timed at, and the 1-minute load average before / after timing (the machine has "
              f"{os.cpu_count()} CPUs): " + ", ".join(
                  f"{m.model} {m.timed_at[11:16]} {m.load_avg[0]:.1f}/{m.load_avg[1]:.1f}" for m in result.models), ""]
    lines += breakdown_markdown(result)
    return "\n".join(lines)


def breakdown_markdown(result: BenchResult) -> list[str]:
    """Where the collage contender's time goes, per model (after the timing, from runs of its artifact
    with the runtime's region timer on; see ``collage_runtime.profile``)."""

    parts = []
    for m in result.models:
        if not m.breakdown:
            continue
        if "error" in m.breakdown:
            parts += [f"**{m.model}**: no breakdown: {m.breakdown['error']}", ""]
        elif m.breakdown.get("regions") is not None:
            parts += _breakdown_lines(m.model, Breakdown.from_json(m.breakdown))
    if not parts:
        return []
    return ["## Where collage's time goes", "",
            "Runs of the collage artifact after the timing, with the runtime's region timer on: per library "
            "region the engine's time and its boundary (the `collage_rt` call less the engine), and the gap "
            "before it (IREE's work since the previous region call, and the VM's transition); the largest shown.",
            "", *parts]


def to_png(result: BenchResult, path: Path) -> None:
    """Two panels: each contender's latency relative to the best peer per model (log scale, plain tick
    labels, each bar labelled with its ms), and collage's speedup over the best peer; the legend below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    names, models = result.contenders, result.models
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(models) + 6), 5), layout="constrained",
                                   gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(len(names), 1)
    lowest, highest = 1.0, 1.0
    for k, n in enumerate(names):
        bars = []  # (x, latency / best peer's, ms)
        for i, m in enumerate(models):
            c, best = m.result(n), m.best(peers(result)) or m.best(names)
            if c and c.median_ms is not None and best and c.status is Status.OK:
                bars.append((i + (k - (len(names) - 1) / 2) * width, c.median_ms / best.median_ms, c.median_ms))
        lowest = min([lowest] + [b[1] for b in bars])
        highest = max([highest] + [b[1] for b in bars])
        ax1.bar([b[0] for b in bars], [b[1] for b in bars], width, label=n, hatch="//" if n == COLLAGE else None)
        for x, y, ms in bars:
            ax1.annotate(f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}", (x, y), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                         fontsize=6, rotation=90)
    ax1.set_yscale("log")
    # The best peer's bar (1.0), and any faster collage, stay visible; the top leaves a fifth of the height
    # (in log terms) for the bars' labels, so they stay inside the axes.
    bottom = min(0.5, 0.7 * lowest)
    ax1.set_ylim(bottom, highest * (highest / bottom) ** 0.25)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    decades = math.log10(highest / bottom)
    ax1.yaxis.set_major_locator(LogLocator(10, subs=(1, 2, 5) if decades <= 2 else (1,)))
    ax1.yaxis.set_major_formatter(plain)  # 0.5, 1, 2 (not 5×10⁻¹)
    ax1.yaxis.set_minor_formatter(NullFormatter())
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_xticks(range(len(models)), [m.model for m in models], rotation=20, ha="right", rotation_mode="anchor")
    ax1.set_ylabel("latency / best peer's (lower is better; labels: ms)")
    ax1.legend(fontsize=7, ncol=min(len(names), 8), loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    ax1.set_title(f"{result.options.threads} threads, median of interleaved runs")
    ratios = [m.ratio(COLLAGE, peers(result)) or 0.0 for m in models]
    speedups = ax2.bar(range(len(models)), ratios, color=["tab:green" if r >= 1 else "tab:red" for r in ratios])
    top = 1.1 * max([1.0, *ratios])
    tall = [r >= 0.15 * top for r in ratios]  # labelled inside; a short bar above its top
    ax2.bar_label(speedups, [f"{r:.2f}x" if t else "" for r, t in zip(ratios, tall)], label_type="center",
                  fontsize=8, color="white")
    ax2.bar_label(speedups, [f"{r:.2f}x" if r and not t else "" for r, t in zip(ratios, tall)], fontsize=8)
    ax2.set_ylim(0, top)
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_xticks(range(len(models)), [m.model for m in models], rotation=30, ha="right", rotation_mode="anchor")
    ax2.set_ylabel("collage speedup over best peer")
    ax2.set_title(f"geomean {geomean_ratio(result) or 0:.2f}x")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: BenchResult, out_dir: str | Path, name: str, command: str) -> list[Path]:
    """Writes OUT/NAME.json, OUT/NAME.md and OUT/NAME.png; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(to_json(result, command), indent=1) + "\n")
    paths[1].write_text(to_markdown(result, command))
    to_png(result, paths[2])
    return paths


def _breakdown_lines(model: str, b: Breakdown, top: int = 12) -> list[str]:
    """The breakdown as markdown lines: a summary line, then the ``top`` largest library regions."""
    def share(ms: float) -> str:
        return f"{100 * ms / b.total_ms:.0f} %" if b.total_ms else "—"

    codegen = ", ".join(f"{n} ops on {backend}" for backend, n in b.codegen) or "none"
    lines = [f"**{model}**: a run of the collage artifact takes {b.total_ms:.3g} ms (the median run of {b.repeats}, "
             f"region timer on): {len(b.regions)} library region call(s), engines {b.engine_ms:.3g} ms ({share(b.engine_ms)}), "
             f"their boundaries {b.boundary_ms:.3g} ms ({share(b.boundary_ms)}), outside library regions "
             f"{b.outside_ms:.3g} ms ({share(b.outside_ms)}: IREE's work and the VM's transitions, of which "
             f"{b.tail_ms:.3g} ms after the last region). IREE-compiled regions: {codegen}; "
             f"{b.default_ops} ops on the default backend outside any region.", ""]
    by_backend: dict[str, list[float]] = {}
    for r in b.regions:
        acc = by_backend.setdefault(r.backend, [0, 0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += r.ops
        acc[2] += r.engine_ms
        acc[3] += r.boundary_ms
    if len(b.regions) > 1:
        lines += ["Per backend: " + "; ".join(
            f"{name}: {n} regions, {ops} ops, engines {e:.3g} ms, boundaries {bd:.3g} ms"
            for name, (n, ops, e, bd) in by_backend.items()) + ".", ""]
    if b.regions:
        lines += ["| region | backend | ops | engine ms | share | boundary ms | gap before ms (IREE work + transition) |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        shown = sorted(b.regions, key=lambda r: -(r.engine_ms + r.boundary_ms + r.gap_before_ms))[:top]
        for r in shown:
            lines.append(f"| {r.name} | {r.backend} | {r.ops} | {r.engine_ms:.3f} | {share(r.engine_ms)} | "
                         f"{r.boundary_ms:.3f} | {r.gap_before_ms:.3f} |")
        if len(b.regions) > top:
            rest = [r for r in b.regions if r not in shown]
            lines.append(f"| {len(rest)} more | | {sum(r.ops for r in rest)} | {sum(r.engine_ms for r in rest):.3f} | "
                         f"{share(sum(r.engine_ms for r in rest))} | {sum(r.boundary_ms for r in rest):.3f} | "
                         f"{sum(r.gap_before_ms for r in rest):.3f} |")
        lines.append("")
    return lines
