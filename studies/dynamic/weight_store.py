"""Weights written once: a shaped artifact's size, load time and memory, with and without its weight store.

Compiles one zoo model of the dynamic zoo (``dynamic_zoo.export``) into an artifact of shape buckets with
each plan given, then loads it in a fresh process and calls every bucket once: artifact bytes (and the
store's), compile seconds, load seconds, the process's resident memory after the load and after the calls
(anonymous and file-backed: the store's mapped pages are the page cache's, shared) and its peak, and the
median of 7 calls at the first bucket. ``--before SRC`` runs the same with the collage-mlir sources at
``SRC`` (a ``git worktree`` of an earlier commit) first on ``PYTHONPATH``, alternating with this checkout.

    git worktree add /tmp/collage-before <commit>
    python -m studies.dynamic.weight_store --model bert --plans whole:openvino,whole:ort --before /tmp/collage-before

Writes ``weight_store.{json,md}`` beside this file (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from studies.common.report import header, write_report
from studies.dynamic.dynamic_zoo import cases, export

HERE = Path(__file__).parent
ROOT = HERE.parent.parent

#: Run in a fresh process: load the artifact, call each bucket once; print JSON.
LOAD = r"""
import json, statistics, sys, time
sys.path[:0] = ["{repo}"]
from studies.dynamic.dynamic_zoo import example
def mem():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return {{k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}}
import collage_runtime
before = mem()
t = time.perf_counter()
program = collage_runtime.load("{art}")
load_s = time.perf_counter() - t
loaded = mem()
for b in program.table.buckets:
    program.invoke("main", example("{model}", dict(b.values)))
called = mem()
x = example("{model}", dict(program.table.buckets[0].values))
times = []
for _ in range(7):
    t = time.perf_counter()
    program.invoke("main", x)
    times.append((time.perf_counter() - t) * 1e3)
print(json.dumps({{"load_s": load_s, "before": before, "loaded": loaded, "called": called,
                  "first_bucket_ms": statistics.median(times), "file": collage_runtime.__file__}}))
"""


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(variant: str, src: Path | None, model: Path, name: str, plan: str, flags: list[str], work: Path) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), str(src / "runtime"), env.get("PYTHONPATH", "")])
    art = work / f"{variant}-{plan.replace(':', '_')}"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "compile", str(model), *flags, "--plan", plan,
                    "--fallback", "none" if "--pad" in flags else "openvino", "-o", str(art)],
                   check=True, env=env, cwd=work)
    compile_s = time.perf_counter() - t
    store = art / "weights.bin"
    loaded = subprocess.run([sys.executable, "-c", LOAD.format(repo=ROOT, art=art, model=name)], check=True,
                            env=env, cwd=work, capture_output=True, text=True)
    row = {"variant": variant, "plan": plan, "compile_s": compile_s, "artifact_bytes": du(art),
           "store_bytes": store.stat().st_size if store.is_file() else 0,
           **json.loads(loaded.stdout.strip().splitlines()[-1])}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert", choices=["bert", "resnet50"])
    parser.add_argument("--plans", default="whole:openvino,whole:ort")
    parser.add_argument("--before", type=Path, default=None, help="collage-mlir sources of the earlier version")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    case = cases(1)[args.model]
    rows = []
    with tempfile.TemporaryDirectory(prefix="collage-weights-") as tmp:
        work = Path(tmp)
        model = export(case.name, work)
        for plan in args.plans.split(","):
            for variant, src in ((("before", args.before),) if args.before else ()) + (("after", None),):
                rows.append(run(variant, src, model, case.name, plan, case.flags(), work))
                shutil.rmtree(work / f"{variant}-{plan.replace(':', '_')}")
        model_size = model.stat().st_size
    head = header("weight_store")
    mib = 2 ** 20
    lines = [f"{head['device']}, {time.strftime('%Y-%m-%d')}, `{head['command']}`", "",
             f"{args.model}: `{' '.join(case.flags())}`; the exported model is {model_size / mib:.0f} MiB", "",
             "| plan | variant | artifact MiB | store MiB | compile s | load s | anon MiB after load | file-backed MiB "
             "| anon MiB after a call per bucket | peak RSS MiB | first bucket ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['plan']} | {r['variant']} | {r['artifact_bytes'] / mib:.1f} | {r['store_bytes'] / mib:.1f} "
                     f"| {r['compile_s']:.0f} | {r['load_s']:.2f} | {(r['loaded']['RssAnon'] - r['before']['RssAnon']) / mib:.0f} "
                     f"| {(r['loaded']['RssFile'] - r['before']['RssFile']) / mib:.0f} "
                     f"| {(r['called']['RssAnon'] - r['before']['RssAnon']) / mib:.0f} | {r['called']['VmHWM'] / mib:.0f} "
                     f"| {r['first_bucket_ms']:.1f} |")
    write_report(args.out, "weight_store", {**head, "model_bytes": model_size, "rows": rows}, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
