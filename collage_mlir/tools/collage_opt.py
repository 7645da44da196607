"""collage-opt: an mlir-opt-style driver over the collage passes and upstream MLIR/IREE passes.

    collage-opt model.mlir --collage-number-ops --collage-assign="plan=p.json" --collage-outline
    collage-opt model.mlir --pass-pipeline="builtin.module(collage-number-ops,canonicalize)"
    collage-opt - --split-input-file --collage-number-ops < cases.mlir
    collage-opt bad.mlir --split-input-file --verify-diagnostics --collage-number-ops --collage-assign

Passes run in command-line order; a flag naming a pass that is not a collage pass is handed to MLIR's
pass parser (``--canonicalize``, ``--cse``, ``--inline``...). Errors of the collage passes are MLIR
diagnostics on the op they are about; ``--verify-diagnostics`` checks them against the input's
``expected-error {{...}}`` comments (see ``diagnostic_verifier``) instead of printing them.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from collage_runtime.types import split_top_level

from ..errors import CollageError
from ..ir import load_module, new_context, parse_module
from ..passes import PARTITION, PartitionPipeline, PassPipeline, registry
from ..passes.base import describe, option_fields, option_text
from . import exit_quietly, run_tool
from .diagnostic_verifier import DiagnosticVerifier

SPLIT_MARKER = "// -----"
BYTECODE_MAGIC = b"ML\xefR"
USAGE = """usage: collage-opt [FILE|-] [-o OUT] [--split-input-file] [--verify-diagnostics]
                   [--PASS[="opt=val ..."]]... [--pass-pipeline=PIPE]
                   [--mlir-print-ir-after-all] [--mlir-print-ir-before-all] [--mlir-print-debuginfo]
                   [--mlir-elide-elementsattrs-if-larger=N] [--mlir-print-op-generic] [--version]
FILE is MLIR text or bytecode (.mlirbc); upstream MLIR/IREE passes are accepted as --NAME too.
collage passes:
"""


@dataclass
class Options:
    """collage-opt's command line: input, output, splitting, the pass pipeline and MLIR printing flags."""

    source: str = "-"
    output: str | None = None
    split: bool = False
    verify: bool = False
    elements: list[str] = field(default_factory=list)
    print_after_all: bool = False
    print_before_all: bool = False
    debug_info: bool = False
    generic: bool = False
    elide_larger: int | None = None


def _usage(ours: dict) -> str:
    lines = [USAGE]
    for name, cls in ours.items():
        lines.append(f"  --{name:<24}{cls.summary}\n")
        for f, hint in option_fields(cls).values():
            if f.default is not dataclasses.MISSING:  # options; results have factories
                default = option_text(f.default) or "none"
                lines.append(f"      {f.name.replace('_', '-')}=<{describe(hint)}> (default: {default})\n")
    return "".join(lines)


def _pipeline_elements(pipeline: str) -> list[str]:
    """``builtin.module(a,b{x=1},func.func(c))`` → ``["a", "b{x=1}", "func.func(c)"]``."""
    text = pipeline.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    return split_top_level(text, "({")


def build_pipeline(elements: list[str], context) -> PassPipeline:
    """A pipeline of collage passes (``name`` or ``name{opts}``) and upstream elements."""
    ours = registry()
    pipeline = PassPipeline(context)
    for elem in elements:
        name, _, opts = elem.partition("{")
        if name == PARTITION:  # the pipeline `collage compile` runs, with its passes' options
            for p in PartitionPipeline.from_options(opts.rstrip("}")).passes():
                pipeline.add(p)
            continue
        if name in ours:
            pipeline.add(ours[name].from_options(opts.rstrip("}")))
            continue
        try:
            pipeline.add(elem)
        except ValueError as exc:
            raise CollageError(f"unknown pass or bad pipeline element '{elem}': {' '.join(str(exc).split())}; "
                               f"collage passes: {', '.join(ours)}", where="collage-opt") from None
    return pipeline


def parse_args(argv: list[str]) -> Options:
    """collage-opt's options from mlir-opt-style arguments (passes in order)."""
    ours = registry()
    opts, inputs = Options(), []
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            print(_usage(ours), end="")
            raise SystemExit(0)
        if arg == "--version":
            print(f"collage-opt {__version__} (IREE compiler {_iree_version()})")
            raise SystemExit(0)
        if arg == "-o":
            opts.output = next(it, None)
            if opts.output is None:
                raise CollageError("-o needs a file name", exit_code=2)
        elif arg.startswith("-o") and len(arg) > 2:
            opts.output = arg[2:]
        elif arg == "--split-input-file":
            opts.split = True
        elif arg == "--verify-diagnostics":
            opts.verify = True
        elif arg == "--mlir-print-ir-after-all":
            opts.print_after_all = True
        elif arg == "--mlir-print-ir-before-all":
            opts.print_before_all = True
        elif arg == "--mlir-print-debuginfo":
            opts.debug_info = True
        elif arg == "--mlir-print-op-generic":
            opts.generic = True
        elif arg.startswith("--mlir-elide-elementsattrs-if-larger="):
            value = arg.split("=", 1)[1]
            if not value.isdigit():
                raise CollageError(f"{arg}: expected a number of elements", exit_code=2)
            opts.elide_larger = int(value)
        elif arg.startswith("--mlir-"):
            raise CollageError(f"unsupported MLIR option '{arg}'", exit_code=2)
        elif arg.startswith("--pass-pipeline="):
            opts.elements += _pipeline_elements(arg.split("=", 1)[1])
        elif arg.startswith("--"):
            name, eq, pass_opts = arg[2:].partition("=")
            pass_opts = pass_opts.strip("\"'")
            opts.elements.append(f"{name}{{{pass_opts}}}" if eq and pass_opts else name)
        else:
            inputs.append(arg)
    if len(inputs) > 1:
        raise CollageError(f"one input file at a time (got {', '.join(inputs)})", exit_code=2)
    opts.source = inputs[0] if inputs else "-"
    return opts


def _iree_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iree-base-compiler")
    except PackageNotFoundError:
        return "unknown"


def _read_input(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    path = Path(source)
    if not path.is_file():
        raise CollageError("no such file", where=source)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CollageError(f"cannot read: {exc.strerror}", where=source) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def body() -> int:
        opts = parse_args(argv)
        where = "<stdin>" if opts.source == "-" else opts.source
        data = _read_input(opts.source)
        text = ""
        if data.startswith(BYTECODE_MAGIC):
            chunks: list[str | bytes] = [data]  # bytecode: one module, never split
        else:
            try:
                text = data.decode()
            except UnicodeDecodeError:
                raise CollageError("neither MLIR text (UTF-8) nor MLIR bytecode", where=where) from None
            chunks = list(text.split(SPLIT_MARKER)) if opts.split else [text]
        # Locations name the file as given, or "-" for text parsed from a string.
        verifier = DiagnosticVerifier(text, (where, opts.source, "-")) if opts.verify else None
        results, failed, line = [], 0, 0
        for chunk in chunks:
            # Pad text with newlines so locations keep the original file's line numbers.
            padded = chunk if isinstance(chunk, bytes) else "\n" * line + chunk
            line += chunk.count("\n") if isinstance(chunk, str) else 0
            context = new_context()
            if verifier is not None:
                verifier.attach(context)
            # A bad pipeline is the command's error, not the input's: it stops the run.
            pipeline = build_pipeline(opts.elements, context)
            seen_before = len(verifier.seen) if verifier is not None else 0
            try:
                if opts.split or opts.source == "-":
                    module = parse_module(padded, context, where=where)
                else:  # parsed from the file, so locations (--mlir-print-debuginfo) name it
                    module = load_module(opts.source, context)
                if opts.print_after_all or opts.print_before_all:
                    pipeline.pm.enable_ir_printing(print_before_all=opts.print_before_all,
                                                   print_after_all=opts.print_after_all,
                                                   large_elements_limit=opts.elide_larger,
                                                   enable_debug_info=opts.debug_info)
                pipeline.run(module)
                buf = io.StringIO()
                module.operation.print(large_elements_limit=opts.elide_larger, enable_debug_info=opts.debug_info,
                                       print_generic_op_form=opts.generic, file=buf)
                results.append(buf.getvalue().rstrip("\n") + "\n" if opts.debug_info or opts.generic
                               or opts.elide_larger is not None else str(module.operation))
            except CollageError as exc:
                if verifier is not None:  # the chunk's diagnostics are checked below
                    if len(verifier.seen) == seen_before:
                        verifier.add_unlocated(str(exc))
                    continue
                if not opts.split:
                    raise
                print(f"collage-opt: error: {exc}", file=sys.stderr)
                failed += 1
        out = f"\n{SPLIT_MARKER}\n".join(results)
        if opts.output and opts.output != "-":
            try:
                Path(opts.output).write_text(out)
            except OSError as exc:
                raise CollageError(f"cannot write: {exc.strerror}", where=opts.output) from None
        else:
            sys.stdout.write(out)
        if verifier is not None:
            problems = verifier.verify()
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        return 1 if failed else 0

    return run_tool("collage-opt", body)


def entry() -> None:
    """Console-script entry point."""
    exit_quietly(main())


if __name__ == "__main__":
    entry()
