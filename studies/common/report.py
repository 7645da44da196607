"""Writes a benchmark's results: OUT/<name>.json (the data) and OUT/<name>.md (the table), and prints
the table."""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path


def header(name: str) -> dict:
    """What every result file starts with: the benchmark, the command that made it, the machine."""
    from collage_mlir.measure import HARNESS_VERSION
    from collage_mlir.measure.device import device_fingerprint

    return {"benchmark": name, "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
            "device": device_fingerprint()[1], "python": platform.python_version(),
            "harness_version": HARNESS_VERSION}


def write_report(out_dir: str | Path, name: str, result: dict, markdown: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown)
    print(markdown)
