"""collage-opt: an mlir-opt-style driver over the collage passes and upstream MLIR/IREE passes.

    collage-opt model.mlir --collage-number-ops --collage-assign="plan=p.json" --collage-outline
    collage-opt model.mlir --pass-pipeline="builtin.module(collage-number-ops,canonicalize)"
    collage-opt - --split-input-file --collage-number-ops < cases.mlir

Passes run in command-line order; a flag naming a pass that is not a collage pass is handed to MLIR's
pass parser (``--canonicalize``, ``--cse``, ``--inline``...).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import CollageError
from ..ir import new_context, parse_module, passmanager
from ..passes import registry, run_pipeline
from . import exit_quietly, run_tool

SPLIT_MARKER = "// -----"
USAGE = """usage: collage-opt [FILE|-] [-o OUT] [--split-input-file] [--PASS[="opt=val ..."]]... [--pass-pipeline=PIPE]
collage passes:
"""


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _pipeline_elements(pipeline: str) -> list[str]:
    """``builtin.module(a,b{x=1},func.func(c))`` → ``["a", "b{x=1}", "func.func(c)"]``."""
    text = pipeline.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    return _split_top_level(text)


def build_pass_manager(elements: list[str], context) -> passmanager.PassManager:
    """A module PassManager of collage passes (``name`` or ``name{opts}``) and upstream elements."""
    ours = registry()
    with context:
        pm = passmanager.PassManager("builtin.module")
        for elem in elements:
            name, _, opts = elem.partition("{")
            if name in ours:
                ours[name].from_options(opts.rstrip("}")).add_to(pm)
                continue
            try:
                pm.add(elem)
            except ValueError as exc:
                raise CollageError(f"unknown pass or bad pipeline element '{elem}': {' '.join(str(exc).split())}; "
                                   f"collage passes: {', '.join(ours)}", where="collage-opt") from None
    return pm


def parse_args(argv: list[str]) -> tuple[str, str | None, bool, list[str]]:
    """(input, output, split, pipeline elements) from mlir-opt-style arguments, in order."""
    ours = registry()
    source, output, split, elements = "-", None, False, []
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            print(USAGE + "".join(f"  --{n:<22}{c.summary}\n" for n, c in ours.items()), end="")
            raise SystemExit(0)
        if arg == "-o":
            output = next(it, None)
        elif arg.startswith("-o") and len(arg) > 2:
            output = arg[2:]
        elif arg == "--split-input-file":
            split = True
        elif arg.startswith("--pass-pipeline="):
            elements += _pipeline_elements(arg.split("=", 1)[1])
        elif arg.startswith("--"):
            name, eq, opts = arg[2:].partition("=")
            opts = opts.strip("\"'")
            elements.append(f"{name}{{{opts}}}" if eq and opts else name)
        else:
            source = arg
    return source, output, split, elements


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def body() -> int:
        source, output, split, elements = parse_args(argv)
        where = "<stdin>" if source == "-" else source
        if source == "-":
            text = sys.stdin.read()
        else:
            path = Path(source)
            if not path.is_file():
                raise CollageError("no such file", where=source)
            text = path.read_text()
        chunks = text.split(SPLIT_MARKER) if split else [text]
        results, failed, line = [], 0, 0
        for chunk in chunks:
            # Pad with newlines so locations keep the original file's line numbers.
            padded = "\n" * line + chunk
            line += chunk.count("\n")
            try:
                context = new_context()
                module = parse_module(padded, context, where=where)
                pm = build_pass_manager(elements, context)
                run_pipeline(pm, module)
                results.append(str(module.operation))
            except CollageError as exc:
                if not split:
                    raise
                print(f"collage-opt: error: {exc}", file=sys.stderr)
                failed += 1
        out = f"\n{SPLIT_MARKER}\n".join(results)
        if output and output != "-":
            Path(output).write_text(out)
        else:
            sys.stdout.write(out)
        return 1 if failed else 0

    return run_tool("collage-opt", body)


def entry() -> None:
    """Console-script entry point."""
    exit_quietly(main())


if __name__ == "__main__":
    entry()
