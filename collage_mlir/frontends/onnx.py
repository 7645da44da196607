"""ONNX frontend: an ``.onnx`` file to StableHLO through torch-mlir's ONNX importer and lowering.

    ONNX model ──(onnx shape inference)──► torch-mlir onnx_importer (torch.operator "onnx.*")
      ──► convert-torch-onnx-to-torch ──► torch backend contract ──► torch-backend-to-stablehlo-backend-pipeline

The StableHLO is handed to IREE's context as bytecode (two MLIR builds, as for the torch frontend). The
model's graph becomes ``@main``. What it cannot import: ONNX ops torch-mlir has no conversion for, graphs
whose shapes ONNX's shape inference cannot resolve statically, and external-data models whose data files
are missing; each is one CollageError naming the cause. A model refused as it is gets a second try with
its constant subgraphs folded (``fold_shapes``, called by ``frontends.load_model``): an export's shape
arithmetic on static shapes is constant, but torch-mlir lowers it as dynamic.

torch-mlir's importer and lowering crash the process on some models (a segfault on six of ONNX's node
tests, aborts on unsigned types): by default the import runs in a child process (``python -m
collage_mlir.frontends.onnx``), so a crash is one CollageError too, not the end of ``collage`` without a
word. A caller that is itself a disposable child (the conformance runner) imports in place.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import CollageError
from ..ir import ir, parse_module
from ..processes import python_command
from .onnx_functions import expand_functions
from .onnx_qdq import normalize_quantized

PIPELINE = ("builtin.module(func.func(convert-torch-onnx-to-torch),torch-lower-to-backend-contract,"
            "torch-backend-to-stablehlo-backend-pipeline)")


#: Exit status of the import child for a CollageError (its one line on stderr).
_REFUSED = 3


def import_onnx(path: str | Path, context: ir.Context, *, func_name: str = "main", isolated: bool = True) -> ir.Module:
    """Imports the ONNX model at ``path`` as StableHLO into ``context`` (its graph as ``@func_name``);
    ``isolated``: in a child process, so that a crash of torch-mlir's importer is a CollageError."""
    if not isolated:
        imported = parse_module(stablehlo_bytecode(path, func_name), context, where=str(path))
        unsigned_compares(imported)
        return imported
    with tempfile.TemporaryDirectory(prefix="collage-onnx-") as tmp:
        out = Path(tmp) / "model.mlirbc"
        proc = subprocess.run(python_command(__name__, str(path), str(out), func_name), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if proc.returncode == 0:
            imported = parse_module(out.read_bytes(), context, where=str(path))
            unsigned_compares(imported)
            return imported
    if proc.returncode == -signal.SIGINT:
        raise KeyboardInterrupt
    if proc.returncode == _REFUSED:
        # The child's line names the model already (its CollageError's ``where``).
        raise CollageError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"{path}: cannot import")
    code = proc.returncode
    how = f"died of {signal.Signals(-code).name}" if code < 0 and -code in signal.Signals._value2member_map_ \
        else f"exited with status {code}"
    tail = " ".join(proc.stderr.split())[-200:]
    raise CollageError(f"cannot import the ONNX model: torch-mlir's importer {how}" + (f" ({tail})" if tail else ""),
                       where=str(path))


def fold_shapes(path: Path, out_dir: Path) -> Path:
    """The model at ``path`` with its constant subgraphs folded (ONNX Runtime's basic graph optimizations,
    saved as ONNX into ``out_dir``; dequantizations of constants kept); ``path`` itself where ONNX Runtime
    cannot load it. An export's shape arithmetic (``Shape`` → ``Gather`` → ``Concat`` → ``Expand``) is constant once
    the inputs are static, but torch-mlir lowers what it computes as dynamic (BERT's position ids: a run-time
    assert IREE cannot legalize). Function ops torch-mlir cannot lower are expanded first (``expand_functions``):
    their bodies compute axes and shapes from the inputs' shapes, constant here too."""
    import onnx
    import onnxruntime as ort

    source = Path(path)
    try:
        model = onnx.load(str(path))
    except Exception:  # noqa: BLE001  (the import reports an unreadable model)
        return path
    if expand_functions(model):
        source = Path(out_dir) / f"{Path(path).stem}.expanded.onnx"
        onnx.save(model, str(source), save_as_external_data=model.ByteSize() > _PROTOBUF_LIMIT)
    folded = Path(out_dir) / f"{Path(path).stem}.folded.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(folded)
    # Weights beside the folded model, in ``out_dir``: ORT would otherwise keep the source's external-data
    # references (``model.onnx.data``, as torch.onnx.export writes it), which do not resolve from there.
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                     f"{folded.stem}.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.log_severity_level = 4
    try:
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (ORT refuses some models torch-mlir imports: the import says what it can)
        return path if source == Path(path) else source
    return folded if folded.is_file() else source


#: Protobuf's 2 GiB message limit, less a margin: a larger model is saved with its weights beside it.
_PROTOBUF_LIMIT = 1_800_000_000


def stablehlo_bytecode(path: str | Path, func_name: str) -> bytes:
    """The ONNX model at ``path`` as StableHLO bytecode of torch-mlir's build, its graph ``@func_name``."""
    try:
        import onnx
        from torch_mlir import ir as tm_ir
        from torch_mlir.compiler_utils import TorchMlirCompilerError, run_pipeline_with_repro_report
        from torch_mlir.dialects import torch as torch_d
        from torch_mlir.extras import onnx_importer
    except ImportError as exc:
        raise CollageError(f"the ONNX frontend needs onnx and torch-mlir ({exc}); "
                           "run `pip install 'collage-mlir[torch,ort]'`") from None
    where = str(path)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001  onnx raises DecodeError, ValidationError, OSError...
        raise CollageError(f"cannot read the ONNX model: {' '.join(str(exc).split())[:300]}", where=where) from None
    try:
        normalize_quantized(model)
    except CollageError as exc:
        raise CollageError(str(exc), where=where) from None
    expand_functions(model)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001  onnx raises ValidationError, InferenceError...
        raise CollageError(f"cannot read the ONNX model: {' '.join(str(exc).split())[:300]}", where=where) from None
    unsigned = _aborting_types(model)
    if unsigned:
        raise CollageError(f"cannot import the ONNX model: it has {'/'.join(unsigned)} tensors, on which torch-mlir's "
                           "ONNX importer aborts the process (unsigned integers other than uint8/uint32)", where=where)
    tm_context = tm_ir.Context()
    torch_d.register_dialect(tm_context)
    diagnostics: list[str] = []

    def collect(diagnostic) -> bool:  # handled here: torch-mlir would print it to stderr
        diagnostics.append(str(diagnostic.message))
        return True

    handler = tm_context.attach_diagnostic_handler(collect)
    try:
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=tm_context).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        run_pipeline_with_repro_report(module, PIPELINE, "ONNX to StableHLO")
    except (TorchMlirCompilerError, onnx_importer.OnnxImportError, ValueError, RuntimeError) as exc:
        why = diagnostics[0] if diagnostics else str(exc)
        raise CollageError(f"cannot import the ONNX model: {' '.join(why.split())[:300]}", where=where) from None
    finally:
        handler.detach()
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "func.func":
            op.operation.attributes["sym_name"] = tm_ir.StringAttr.get(func_name, tm_context)
            break
    buf = io.BytesIO()
    module.write_bytecode(buf)
    return buf.getvalue()


def unsigned_compares(module: ir.Module) -> int:
    """Makes every ``stablehlo.compare`` of unsigned integers compare UNSIGNED; returns how many changed.
    torch-mlir's lowering states ``SIGNED`` for them (ONNX's ``GreaterOrEqual`` on uint8), which StableHLO's
    spec forbids: IREE reads the operand type and computes the right answer, XLA's HLO verifier refuses
    the region at its first call ("Expected comparison type UNSIGNED")."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if op.name == "stablehlo.compare" and isinstance(op.operands[0].type, ir.RankedTensorType):
            element = ir.RankedTensorType(op.operands[0].type).element_type
            if isinstance(element, ir.IntegerType) and element.is_unsigned:
                found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context:
        for op in found:
            op.attributes["compare_type"] = ir.Attribute.parse("#stablehlo<comparison_type UNSIGNED>")
    return len(found)


def _aborting_types(model) -> list[str]:
    """The element types of ``model``'s tensors (inputs, outputs, inferred values, initializers) on which
    torch-mlir's lowering aborts the process ("LLVM ERROR: Unhandled type in getScalarTypeForType: ui16",
    seen on ONNX's Add/TopK node tests): uint16 and uint64."""
    from onnx import TensorProto

    graph = model.graph
    types = {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    types |= {t.data_type for t in graph.initializer}
    return [TensorProto.DataType.Name(t).lower() for t in (TensorProto.UINT16, TensorProto.UINT64) if t in types]


def _child(argv: list[str]) -> int:
    """``python -m collage_mlir.frontends.onnx MODEL OUT FUNC``: writes the StableHLO bytecode to OUT, or
    prints the CollageError's line and exits ``_REFUSED``."""
    path, out, func_name = argv
    try:
        Path(out).write_bytes(stablehlo_bytecode(path, func_name))
    except CollageError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return _REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
