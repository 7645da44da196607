"""StableHLO as it comes from frameworks, made ready for numbering: every call to a function of the module
is inlined and functions nothing calls any more are dropped.

JAX and flax emit private functions (``func.call @relu`` for ``jax.nn.relu``, one per nested module). A call
is one opaque op to the graph, so every graph-engine region would stop at it (a JAX ResNet-18 became 42
regions of at most 7 ops under ``prefer:openvino``). The public functions keep their names, types and
argument/result attributes (JAX's ``jax.result_info``, ``mhlo.sharding``...), so the compiled program's
entry points are the ones the framework wrote.
"""

from __future__ import annotations

from pathlib import Path

from ..dialects import collage
from ..errors import CollageError
from ..ir import diagnostics_text, ir, load_module, parse_module, passmanager
from . import wide_sums

#: MLIR's inliner, then the removal of private functions nothing calls.
PIPELINE = "builtin.module(inline{default-pipeline=canonicalize},symbol-dce)"


def _calls(module: ir.Module) -> bool:
    """Whether any function of ``module`` calls another (``func.call``), at any depth."""
    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        if op.name == "func.call":
            found = True
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _signatures(module: ir.Module) -> dict[str, tuple[str, str, str]]:
    """Public function name → (type, argument attributes, result attributes), as text."""
    out = {}
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        attrs = op.operation.attributes
        if "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value != "public":
            continue
        out[ir.StringAttr(attrs["sym_name"]).value] = tuple(
            str(attrs[k]) if k in attrs else "" for k in ("function_type", "arg_attrs", "res_attrs"))
    return out


def normalize(module: ir.Module, *, where: str = "<input>") -> ir.Module:
    """Inlines every call of ``module`` in place (see the module docstring), widens its bf16/f16 sums to f32
    (``wide_sums``), marks it as computing in float64 where its signature or a kept ONNX node says so
    (``collage.mark_float64``) and returns it. One whose calls cannot all be inlined (recursion) is one
    CollageError."""
    collage.mark_float64(module)
    wide_sums.widen(module)
    if not _calls(module):
        return module
    before = _signatures(module)
    try:
        with module.context:
            passmanager.PassManager.parse(PIPELINE).run(module.operation)
    except ir.MLIRError as exc:
        raise CollageError(f"cannot inline the module's function calls: {diagnostics_text(exc, where)}") from None
    if _calls(module):
        raise CollageError("the module's function calls cannot all be inlined (a recursive function?); "
                           "collage places ops of one function body", where=where)
    after = _signatures(module)
    assert after == before, f"inlining changed the public signatures: {before} -> {after}"
    return module


def load(path: str | Path, context: ir.Context) -> ir.Module:
    """A ``.mlir``/``.mlirbc`` file, normalized."""
    return normalize(load_module(path, context), where=str(path))


def parse(source: str | bytes, context: ir.Context, *, where: str = "<input>") -> ir.Module:
    """MLIR text or bytecode held in memory (a ``jax.jit(f).lower(...)`` module), normalized."""
    return normalize(parse_module(source, context, where=where), where=where)
