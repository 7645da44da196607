"""Where a GPU program goes wrong or slow: a diagnosis bundle made here, run on the GPU machine.

``prepare`` (here) compiles one model with IREE alone as plain IREE modules (no collage runtime): for the
bundle's architecture, for ``sm_80`` (IREE's own target, JIT-compiled on a newer GPU), and a *tapped* copy
for the bundle's architecture that also returns every top-level op's result, with IREE CPU's value of each
tap (``measure.reference.capture``) as the reference. ``run`` (there) checks each module through plain
``iree.runtime`` (three calls each: a moving error is a race), then the study bundle's artifacts of the model
through ``collage_runtime.Program`` with and without IREE's caching allocator, and profiles the served
regions of the model's library plans (where a served call's time goes).

    python -m studies.gpu.diagnose prepare build/gpu_diag --model resnet50 --arch sm_90
    python -m studies.gpu.diagnose run build/gpu_diag --bundle build/gpu_bundle OUT    # on the GPU machine
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .bundle import Bundle, ModelEntry, ModelSpec, build_model
from .run import as_list, load_arrays, max_error, use_bundle_paths

TAPS = "taps.npz"


#: iree-compile flag sets tried on the whole model: which codegen or scheduling path makes it wrong.
FLAG_VARIANTS = {
    "no_igemm": ("--iree-codegen-llvmgpu-use-igemm=false",),
    "no_vector_distribution": ("--iree-codegen-llvmgpu-use-vector-distribution=false",),
    "no_reduction_vd": ("--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",),
    "no_prefetch": ("--iree-llvmgpu-prefetch-num-stages=0",),
    "opt_O0": ("--iree-opt-level=O0",),
    "serial_streams": ("--iree-stream-partitioning-favor=debug",),
    "direct_conv": ("--iree-codegen-llvmgpu-use-direct-convolution=true",),
}
#: IREE CUDA runtime flags tried on the plain module (each in a fresh process: read when the driver is made).
RUNTIME_VARIANTS = {
    "graphs": ("--cuda_use_streams=false",),
    "sync_alloc": ("--cuda_async_allocations=false",),
    "inline": ("--cuda_allow_inline_execution=true",),
}
PREFIXES = 10


def prepare(out: Path, model_name: str, arch: str) -> None:
    """The whole model plain (for ``arch`` and sm_80, and with each of FLAG_VARIANTS), the model cut after
    PREFIXES convolutions spread over it, and the tapped model; IREE CPU's values as references."""
    from collage_runtime.types import Platform

    from collage_mlir.backends.iree_codegen import ProgramTarget, iree_compile
    from collage_mlir.backends.iree_cuda import IreeCudaBackend
    from collage_mlir.dialects import collage
    from collage_mlir.graph import Graph, number_ops, public_funcs
    from collage_mlir.measure.extract import ValueRef
    from collage_mlir.measure.reference import capture, return_also, set_returns
    from collage_mlir.ir import ir, parse_module, new_context

    from .prepare import import_module

    spec = ModelSpec.parse(model_name)
    out.mkdir(parents=True, exist_ok=True)
    module = import_module(spec)
    number_ops(module)
    graph = Graph(module)
    _, inputs = build_model(spec)
    args = [x.detach().numpy() for x in inputs]
    np.savez(out / "inputs.npz", *args)
    bytecode = io.BytesIO()
    module.operation.write_bytecode(bytecode)
    bytecode = bytecode.getvalue()
    target = IreeCudaBackend().program_target([f"--iree-cuda-target={arch}"])
    entries = []

    made: dict[bytes, str] = {}  # a flag that changes nothing gives the same module: kept once

    def build(name: str, mod, ref: str, flags=()) -> None:
        t = time.perf_counter()
        vmfb = iree_compile(mod, list(flags), target=target)
        if vmfb in made:
            print(f"  {name}: the same module as {made[vmfb]}", flush=True)
            return
        made[vmfb] = name
        (out / f"{name}.vmfb").write_bytes(vmfb)
        entries.append({"file": f"{name}.vmfb", "ref": ref, "runtime_flags": []})
        print(f"  {name}: {time.perf_counter() - t:.0f} s", flush=True)

    # Every top-level op's tensor results, in program order, except constants (their values are known).
    refs = []
    for func in public_funcs(module):
        for op in func.regions[0].blocks[0].operations:
            oid = collage.op_id(op.operation)
            if oid is None or op.operation.name in ("stablehlo.constant", "arith.constant"):
                continue
            refs += [ValueRef("main", oid, k) for k, r in enumerate(op.operation.results)
                     if isinstance(r.type, ir.RankedTensorType)]
    wanted = capture(bytecode, refs, {"main": args})
    names = {r: f"{r.key()} {graph.nodes[r.op].name.removeprefix('stablehlo.')}" for r in refs}
    final = names[refs[-1]]
    np.savez(out / TAPS, **{names[r]: wanted[r] for r in refs})
    build(f"plain_{arch}", parse_module(bytecode, new_context()), final)
    entries += [{"file": f"plain_{arch}.vmfb", "ref": final, "runtime_flags": list(f), "variant": v}
                for v, f in RUNTIME_VARIANTS.items()]
    sm80 = ProgramTarget(Platform.CUDA, ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"))
    (out / "plain_sm_80.vmfb").write_bytes(iree_compile(parse_module(bytecode, new_context()), target=sm80))
    entries.append({"file": "plain_sm_80.vmfb", "ref": final, "runtime_flags": []})
    for v, flags in FLAG_VARIANTS.items():
        build(f"flags_{v}", parse_module(bytecode, new_context()), final, flags)
    convs = [r for r in refs if names[r].endswith(" convolution")]
    for k in np.linspace(0, len(convs) - 1, min(PREFIXES, len(convs))).round().astype(int):
        cut = parse_module(bytecode, new_context())
        with cut.context, ir.Location.unknown():
            func = next(iter(public_funcs(cut)))
            by_id = {collage.op_id(op.operation): op.operation for op in func.regions[0].blocks[0].operations}
            set_returns(func, [by_id[convs[k].op].results[convs[k].index]])
        build(f"prefix_{k:03d}", cut, names[convs[k]])
    tapped = parse_module(bytecode, new_context())
    with tapped.context, ir.Location.unknown():
        func = next(iter(public_funcs(tapped)))
        by_id = {collage.op_id(op.operation): op.operation for op in func.regions[0].blocks[0].operations}
        return_also(func, [by_id[r.op].results[r.index] for r in refs])
    build(f"tapped_{arch}", tapped, "*")
    (out / "diag.json").write_text(json.dumps({"model": spec.label, "arch": arch, "taps": [names[r] for r in refs],
                                               "entries": entries}, indent=1))


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """``run.max_error`` of one array: max |got - want| / max |want| (inf where shapes or finiteness differ)."""
    return max_error([got], [want])


def call_entry(root: Path, entry: dict, calls: int = 3) -> dict:
    """One module of the diagnosis bundle called ``calls`` times through plain iree.runtime on CUDA (its
    runtime flags parsed first: call once per process), each call's error against its reference; the
    tapped module reports its taps over 1e-3, in program order."""
    import iree.runtime as rt

    if entry["runtime_flags"]:
        rt.flags.parse_flags(*entry["runtime_flags"])
    args = list(np.load(root / "inputs.npz").values())
    taps = np.load(root / TAPS)
    names = json.loads((root / "diag.json").read_text())["taps"]
    config = rt.Config("cuda")
    ctx = rt.SystemContext(config=config)
    mod = rt.VmModule.copy_buffer(ctx.instance, (root / entry["file"]).read_bytes())
    ctx.add_vm_module(mod)
    main = getattr(ctx.modules, mod.name)["main"]
    runs = []
    for _ in range(calls):
        res = main(*args)
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        runs.append([np.array(r.to_host(), copy=True) for r in res])
    if entry["ref"] != "*":
        return {"errors": [rel_error(r[0], taps[entry["ref"]]) for r in runs]}
    tapped = runs[0][len(runs[0]) - len(names):]
    bad = [(n, e) for n in names if (e := rel_error(tapped[names.index(n)], taps[n])) > 1e-3]
    return {"errors": [rel_error(r[0], taps[names[-1]]) for r in runs], "bad_taps": len(bad), "first_bad": bad[:10]}


def check_plain(root: Path, report: dict) -> None:
    """Every module of the diagnosis bundle, each in a child process (runtime flags are per process)."""
    for entry in json.loads((root / "diag.json").read_text())["entries"]:
        key = entry["file"].removesuffix(".vmfb") + (f" runtime {entry['variant']}" if entry.get("variant") else "")
        report[key] = child("call", str(root), json.dumps(entry), timeout=120)
        shown = report[key]
        if isinstance(shown, dict):
            shown = {k: (['%.3g' % e for e in v] if k == "errors" else v) for k, v in shown.items()}
        print(f"{key} (ref {entry['ref'][:40]}): {shown}", flush=True)


def program_errors(bundle_dir: Path, label: str, caching: bool) -> dict:
    """Each plan of ``label`` in the study bundle through collage_runtime (caching allocator on or off),
    called three times: each call's ``max_error`` against the bundle's CPU reference, or why it failed.
    Once per process: the device and its allocator are made once per process."""
    from collage_runtime import Program, engines

    if not caching:
        engines.CACHING_DRIVERS = frozenset()
    entry = model_entry(bundle_dir, label)
    args, want = load_arrays(bundle_dir, entry.inputs), load_arrays(bundle_dir, entry.expected)
    found = {}
    for plan in entry.plans:
        try:
            with Program(bundle_dir / plan.artifact) as p:
                found[plan.plan] = [max_error(as_list(p.invoke(entry.function, *args)), want) for _ in range(3)]
        except Exception as exc:  # noqa: BLE001  (a failing program is a finding)
            found[plan.plan] = "failed: " + " ".join(str(exc).split())[:300]
    return found


def child(*args: str, timeout: float) -> dict | str:
    """``python -m studies.gpu.diagnose ARGS`` in a child process: its RESULT line, or why there is none."""
    proc = subprocess.run([sys.executable, "-m", "studies.gpu.diagnose", *args], capture_output=True, text=True,
                          timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return json.loads(line[7:]) if line else f"failed: {' '.join(proc.stderr.split())[-400:]}"


def check_programs(bundle_dir: Path, label: str, report: dict) -> None:
    """The study bundle's artifacts of ``label`` through collage_runtime, caching allocator on and off."""
    for caching in (True, False):
        key = f"program caching={'on' if caching else 'off'}"
        report[key] = child("programs", str(bundle_dir), label, *(() if caching else ("--no-caching",)), timeout=180)
        print(f"{key}: {report[key]}", flush=True)


def model_entry(bundle_dir: Path, label: str) -> ModelEntry:
    return next(e for e in Bundle.load(bundle_dir).models if e.spec.label == label)


def profile_served(bundle_dir: Path, label: str, report: dict, out: Path) -> None:
    """cProfile of 20 calls of each library plan of ``label`` (inputs on the device), and the region timer's
    call vs executor seconds."""
    from collage_runtime import Program

    entry = model_entry(bundle_dir, label)
    args = load_arrays(bundle_dir, entry.inputs)
    for plan in entry.plans:
        if not plan.regions:
            continue
        times: dict[str, list[tuple[float, float]]] = {}
        p = Program(bundle_dir / plan.artifact,
                    region_timer=lambda r, c, e, times=times: times.setdefault(r, []).append((c, e)))
        fn = p.device_function(entry.function)
        dev = [p.to_device(a) for a in args]
        for _ in range(5):
            fn(*dev)
        times.clear()
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        for _ in range(20):
            fn(*dev)
        prof.disable()
        wall = (time.perf_counter() - t) / 20
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        (out / f"profile_{label}_{plan.plan.replace(':', '_').replace(',', '_')}.txt").write_text(s.getvalue())
        call = sum(c for v in times.values() for c, _ in v) / 20
        execu = sum(e for v in times.values() for _, e in v) / 20
        report[f"served {plan.plan}"] = {"wall_ms": wall * 1e3, "regions": len(times), "calls_ms": call * 1e3,
                                         "executors_ms": execu * 1e3}
        print(f"served {plan.plan}: {wall * 1e3:.2f} ms/call (profiled), {len(times)} regions: served calls "
              f"{call * 1e3:.2f} ms, executors {execu * 1e3:.2f} ms", flush=True)
        p.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.gpu.diagnose", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("out", type=Path)
    a.add_argument("--model", default="resnet50")
    a.add_argument("--arch", default="sm_90")
    b = sub.add_parser("run")
    b.add_argument("diag", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--bundle", type=Path, required=True)
    b.add_argument("--plain-only", action="store_true", help="the diagnosis modules only, not the bundle's")
    c = sub.add_parser("call", help="one module of the diagnosis bundle (check_plain's child)")
    c.add_argument("diag", type=Path)
    c.add_argument("entry", type=json.loads)
    d = sub.add_parser("programs", help="the bundle's programs of one model (check_programs's child)")
    d.add_argument("bundle", type=Path)
    d.add_argument("label")
    d.add_argument("--no-caching", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "call":
        print("RESULT " + json.dumps(call_entry(args.diag, args.entry)))
        return 0
    if args.cmd == "programs":
        use_bundle_paths(args.bundle)
        print("RESULT " + json.dumps(program_errors(args.bundle, args.label, not args.no_caching)))
        return 0
    if args.cmd == "prepare":
        prepare(args.out, args.model, args.arch)
        return 0
    use_bundle_paths(args.bundle)
    args.out.mkdir(parents=True, exist_ok=True)
    label = json.loads((args.diag / "diag.json").read_text())["model"]
    report: dict = {}
    steps = [lambda: check_plain(args.diag, report)]
    if not args.plain_only:
        steps += [lambda: check_programs(args.bundle, label, report),
                  lambda: profile_served(args.bundle, label, report, args.out)]
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001  (one step failing leaves the others' findings)
            report.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}"[:400])
            print(f"step failed: {exc}", flush=True)
        (args.out / "diagnose.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
