"""Baseline: run IREE's e2e StableHLO conformance files with plain IREE.

Each file is compiled with ``iree.compiler`` (llvm-cpu, host CPU) and every
exported function taking no arguments is invoked on ``local-task`` with the
Python ``check`` module from :mod:`check_module`.

Usage::

    python test/conformance/baseline.py FILE [--json]   # one file
    python test/conformance/baseline.py --all [--md OUT] # sweep, one subprocess per file

Files under ``iree-e2e/models/`` verify printed output with FileCheck (their
``// RUN:`` lines); for them we only report "compiles + runs" and skip
functions that need arguments.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
# CI clones the repo with shared/ beside it; COLLAGE_CONFORMANCE_DIR overrides.
CONFORMANCE = Path(os.environ.get("COLLAGE_CONFORMANCE_DIR", HERE.parents[2] / "shared" / "conformance" / "iree-e2e"))
COMPILE_ARGS = dict(target_backends=["llvm-cpu"], input_type="stablehlo",
                    extra_args=["--iree-llvmcpu-target-cpu=host"])
_JSON_MARK = "@@BASELINE_JSON@@"


def _rel(path: Path) -> str:
    """Path relative to the conformance root when possible."""
    try:
        return str(path.resolve().relative_to(CONFORMANCE))
    except ValueError:
        return str(path)


def _first_error(text: str, limit: int = 300) -> str:
    """First ``error:`` line of compiler output (or its head)."""
    for line in text.splitlines():
        if "error:" in line:
            return line.strip()[:limit]
    return text.strip()[:limit]


def _cconv(fn: Any) -> str:
    """Calling convention of a VmFunction, parsed from its repr, e.g. ``0v_v``."""
    m = re.search(r"\((\w*)\)", repr(fn))
    return m.group(1) if m else ""


def _kind(path: Path) -> str:
    """``filecheck`` for models/ and RUN/FileCheck files without check ops, else ``check``."""
    try:
        text = path.read_text()
    except OSError:
        return "check"
    filecheck = path.parent.name == "models" or ("FileCheck" in text and "check.expect" not in text)
    return "filecheck" if filecheck else "check"


def _summary(value: Any, limit: int = 8) -> str:
    """iree-run-mlir style ``2x3xf32=[...]`` summary of a returned value."""
    try:
        a = np.asarray(value.to_host() if hasattr(value, "to_host") else value)
    except Exception:  # noqa: BLE001 - non-tensor results (lists, refs)
        return repr(value)[:80]
    flat = a.reshape(-1)
    vals = " ".join(f"{v:g}" if a.dtype.kind == "f" else str(v) for v in flat[:limit])
    more = " ..." if flat.size > limit else ""
    prefix = {"f": "f", "i": "i", "u": "ui", "c": "complex"}.get(a.dtype.kind)
    dt = "i1" if a.dtype.kind == "b" else f"{prefix}{a.dtype.itemsize * 8}" if prefix else str(a.dtype)
    return "".join(f"{d}x" for d in a.shape) + f"{dt}={vals}{more}"


def run_file(path: str | Path) -> dict:
    """Compile and run one conformance file in this process.

    Returns ``{"file", "kind": "check"|"filecheck", "compiled", "error",
    "functions": {name: {"status": "pass"|"fail"|"skip", "checks", "message",
    "outputs"}}}``; ``outputs`` summarises returned values (``"f32=3"``) so
    FileCheck-style files can at least be compared between builds.
    """
    import iree.compiler.tools as ireec
    import iree.runtime as rt

    sys.path.insert(0, str(HERE))
    from check_module import CheckLog, create_check_module

    path = Path(path)
    kind = _kind(path)
    result: dict[str, Any] = {"file": _rel(path), "kind": kind, "compiled": False,
                              "error": None, "functions": {}}
    try:
        vmfb = ireec.compile_file(str(path), **COMPILE_ARGS)
    except ireec.CompilerToolError as e:
        result["error"] = "compile: " + _first_error(str(e))
        return result
    result["compiled"] = True

    config = rt.Config("local-task")
    log = CheckLog()
    check = create_check_module(config.device, log)
    main = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
    ctx = entry = None
    try:
        ctx = rt.SystemContext(vm_modules=(*config.default_vm_modules, check, main), config=config)
        entry = ctx.modules[main.name]
        inputs = example_inputs(path)
        result["functions"] = run_functions(main, lambda name, args: entry[name](*args), log, kind, inputs)
    except Exception as e:
        result["error"] = "runtime: " + str(e).splitlines()[0][:500]
    finally:
        del entry, ctx, main, check
        gc.collect()
    return result


def example_inputs(path: Path) -> dict[str, list[np.ndarray]]:
    """Deterministic inputs (seeded by function name) for public functions whose arguments are all
    static-shaped int/float tensors, so builds can be compared on functions that take arguments."""
    from iree.compiler import ir

    found: dict[str, list[np.ndarray]] = {}
    with ir.Context():
        module = ir.Module.parseFile(str(path))
        for op in module.body.operations:
            op = op.operation
            if op.name != "func.func" or "sym_visibility" in op.attributes or not op.regions[0].blocks:
                continue
            name = ir.StringAttr(op.attributes["sym_name"]).value
            rng = np.random.default_rng(sum(map(ord, name)))
            args = []
            for t in ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).inputs:
                if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
                    break
                et = str(t.element_type)
                if et == "f32":
                    args.append(rng.standard_normal(t.shape).astype(np.float32))
                elif et in ("i32", "i64"):
                    args.append(rng.integers(0, 4, t.shape).astype(np.int32 if et == "i32" else np.int64))
                else:
                    break
            else:
                if args:
                    found[name] = args
    return found


def run_functions(main: Any, call: Any, log: Any, kind: str, inputs: dict | None = None) -> dict:
    """Invokes every export of VM module ``main`` through ``call(name, args)``: zero-argument ones,
    and those ``inputs`` has arguments for. Per function ``{"status": "pass"|"fail"|"skip", "checks",
    "message", "outputs"}``; ``outputs`` summarise results so two builds can be compared."""
    inputs = inputs or {}
    functions: dict[str, dict] = {}
    for name in main.function_names:
        if name.startswith("__"):
            continue
        cconv = _cconv(main.lookup_function(name))
        rec: dict[str, Any] = {"status": "pass", "checks": 0, "message": "", "outputs": []}
        functions[name] = rec
        if not cconv.startswith("0v") and name not in inputs:
            rec.update(status="skip", message=f"needs arguments ({cconv})")
            continue
        mark = log.mark()
        try:
            out = call(name, inputs.get(name, []))
            outs = out if isinstance(out, (tuple, list)) else () if out is None else (out,)
            rec["outputs"] = [_summary(o) for o in outs]
            del out, outs
        except Exception as e:  # check failure or runtime error
            rec["status"] = "fail"
            rec["message"] = str(e).splitlines()[0][:500]
        rec["checks"], failures = log.since(mark)
        if failures:
            rec["status"], rec["message"] = "fail", " | ".join(failures)[:1000]
        elif kind == "check" and rec["status"] == "pass" and rec["checks"] == 0:
            rec["message"] = "no checks"
    return functions


def run_subprocess(path: Path, timeout: float = 900) -> dict:
    """Run :func:`run_file` in a fresh interpreter so crashes stay contained."""
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, __file__, str(path), "--json"],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"file": _rel(path), "kind": _kind(path), "compiled": None,
                "error": f"timeout after {timeout:.0f}s", "functions": {}}
    for line in p.stdout.splitlines():
        if line.startswith(_JSON_MARK):
            res = json.loads(line[len(_JSON_MARK):])
            break
    else:
        tail = [l for l in p.stderr.splitlines() if "leaked" not in l][-3:]
        res = {"file": _rel(path), "kind": _kind(path), "compiled": None,
               "error": f"crashed (rc={p.returncode}): " + " / ".join(tail)[:400], "functions": {}}
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _counts(res: dict) -> tuple[int, int, int]:
    """(passed, failed, skipped) function counts of one result."""
    st = [f["status"] for f in res["functions"].values()]
    return st.count("pass"), st.count("fail"), st.count("skip")


def report(results: list[dict], command: str) -> str:
    """Markdown table + totals + failure list for a sweep."""
    lines = [f"Command: `{command}`", "",
             "| file | compiled | pass | fail | skip | checks | note |",
             "|---|---|---|---|---|---|---|"]
    tot = dict(files=0, compiled=0, clean=0, p=0, f=0, s=0, checks=0)
    for r in results:
        p, f, s = _counts(r)
        checks = sum(fn["checks"] for fn in r["functions"].values())
        note = r["error"] or ("no checks" if r["kind"] == "check" and r["compiled"] and not checks
                              else "FileCheck file: compiles + runs only" if r["kind"] == "filecheck"
                              else "")
        skips = [f"@{n}: {fn['message']}" for n, fn in r["functions"].items() if fn["status"] == "skip"]
        note = "; ".join([note, *skips]) if note and skips else note or "; ".join(skips)
        lines.append(f"| {r['file']} | {'yes' if r['compiled'] else 'NO'} | {p} | {f} | {s} | "
                     f"{checks} | {note.replace('|', '/')} |")
        tot["files"] += 1
        tot["compiled"] += bool(r["compiled"])
        tot["clean"] += bool(r["compiled"]) and not r["error"] and f == 0
        tot["p"] += p; tot["f"] += f; tot["s"] += s; tot["checks"] += checks
    lines += ["", f"**Totals:** {tot['files']} files, {tot['compiled']} compiled, "
              f"{tot['clean']} without failures; functions: {tot['p']} passed, {tot['f']} failed, "
              f"{tot['s']} skipped; {tot['checks']} checks executed."]
    for kind in ("check", "filecheck"):
        rs = [r for r in results if r["kind"] == kind]
        p, f, s = (sum(_counts(r)[i] for r in rs) for i in range(3))
        lines.append(f"- {kind} files: {len(rs)}, compiled {sum(bool(r['compiled']) for r in rs)}; "
                     f"functions {p} passed, {f} failed, {s} skipped")
    lines += ["", "Failures:", ""]
    for r in results:
        if r["error"]:
            lines.append(f"- `{r['file']}`: {r['error']}")
        for name, fn in r["functions"].items():
            if fn["status"] == "fail":
                lines.append(f"- `{r['file']}` @{name}: {fn['message'].splitlines()[0]}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="one .mlir conformance file")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ap.add_argument("--all", action="store_true", help="sweep every file under iree-e2e/")
    ap.add_argument("--md", help="also write the sweep report to this file")
    args = ap.parse_args()
    if args.all:
        results = []
        for path in sorted(CONFORMANCE.rglob("*.mlir")):
            results.append(run_subprocess(path))
            p, f, s = _counts(results[-1])
            print(f"{_rel(path):55s} {'ok ' if results[-1]['compiled'] else 'ERR'} "
                  f"pass={p} fail={f} skip={s} {results[-1]['error'] or ''}", file=sys.stderr)
        text = report(results, "python test/conformance/baseline.py --all")
        print(text)
        if args.md:
            Path(args.md).write_text(text)
        return
    if not args.file:
        ap.error("give FILE or --all")
    emit(run_file(args.file), args.json)


def emit(res: dict, as_json: bool) -> None:
    """Prints one result: a marked JSON line for a parent process, or indented JSON for a person."""
    print(_JSON_MARK + json.dumps(res) if as_json else json.dumps(res, indent=2), flush=True)


if __name__ == "__main__":
    main()
