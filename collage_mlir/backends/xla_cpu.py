"""`xla-cpu`: XLA's CPU compiler through jaxlib's PJRT client, a graph-level backend.

XLA compiles StableHLO (text or MLIR bytecode) directly, so a region is built into a standalone StableHLO
module, written as bytecode (``regions/<region>.xla.mlirbc``): the region function cloned as the public
``@main``, collage attributes stripped, ``arith.constant`` tensors rewritten as ``stablehlo.constant``
and ``dense_resource`` constants (torch-mlir's weights) inlined as ``dense<...>`` attributes, which XLA's
converter requires ("Only dense elements attr are supported"). jaxlib 0.10.2 reads the bytecode IREE
3.13's MLIR writes (both pinned). The runtime executor
``collage_runtime.executors.xla_pjrt`` compiles it once at load and runs it per call.

Supported ops: every ``stablehlo.*`` and ``chlo.*`` op on static-shaped tensors of the element
types it runs within its tolerance (f32/f64, bf16, i1/i8/i16/i32/i64, ui8), plus ``arith.constant`` tensors
(f64 only inside a region: IREE demotes f64 and cannot pass it across a boundary);
ops with regions (reduce, sort, while, ...) when their bodies hold only such ops. Excluded: ops with
side effects or tokens (custom_call, infeed/outfeed, send/recv, tokens, optimization_barrier),
collectives and replica/partition ids (one device, no replicas), random number generators (results
cannot match the reference), composites (their decomposition function is not carried along) and
tuples.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .base import BackendKind, OpSetBackend, RegionArtifact, Tolerance
from .patterns import OpPattern

#: Ops XLA could compile but that this backend refuses, with the reason shown to the user.
EXCLUDED = {
    "stablehlo.custom_call": "custom calls target a runtime library XLA may not have",
    "stablehlo.infeed": "has side effects (token)",
    "stablehlo.outfeed": "has side effects (token)",
    "stablehlo.send": "has side effects (token)",
    "stablehlo.recv": "has side effects (token)",
    "stablehlo.create_token": "produces a token",
    "stablehlo.after_all": "produces a token",
    "stablehlo.optimization_barrier": "a scheduling barrier, meaningless inside one region",
    "stablehlo.all_reduce": "collective (one device, no replicas)",
    "stablehlo.all_gather": "collective (one device, no replicas)",
    "stablehlo.all_to_all": "collective (one device, no replicas)",
    "stablehlo.reduce_scatter": "collective (one device, no replicas)",
    "stablehlo.collective_permute": "collective (one device, no replicas)",
    "stablehlo.collective_broadcast": "collective (one device, no replicas)",
    "stablehlo.replica_id": "replica/partition ids (one device, no replicas)",
    "stablehlo.partition_id": "replica/partition ids (one device, no replicas)",
    "stablehlo.rng": "random numbers cannot match the reference",
    "stablehlo.rng_bit_generator": "random numbers cannot match the reference",
    "stablehlo.composite": "its decomposition function is not carried into the region module",
    "stablehlo.tuple": "tuples cannot cross region boundaries",
    "stablehlo.get_tuple_element": "tuples cannot cross region boundaries",
}
#: Element types the collage runtime can hand to the executor and on which XLA stays within the
#: tolerance. Not f16: XLA accumulates f16 in f32 where IREE rounds each step, a 16x512 · 512x16 matmul
#: then tanh differed by 0.0044 (rel 0.12) and a 512-element sum then exp by rel 0.006. Not complex:
#: no way to pass it across a boundary and results drift from IREE's by more than a few ULP. bf16: crosses
#: as ml_dtypes' bfloat16, and is checked at bf16's own tolerance (``validate.HALF_RTOL``); a JAX CNN in bf16
#: whole on XLA is jax.jit's program (equal results, its speed: 2.57 ms against IREE alone's 3.25).
ELEMENT_TYPES = ("f32", "f64", "bf16", "i1", "i8", "i16", "i32", "i64", "ui8")
_DIALECTS = ("stablehlo", "chlo")
_TERMINATORS = ("stablehlo.return", "chlo.return")
_ATTR_DIALECT = re.compile(r'#"?([A-Za-z_]\w*)')


def _types_ok(op: ir.Operation) -> str | None:
    for v in list(op.operands) + list(op.results):
        t = v.type
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            return f"{op.name}: needs static-shaped ranked tensors"
        if str(t.element_type) not in ELEMENT_TYPES:
            return f"{op.name}: element type {t.element_type} is not one of {', '.join(ELEMENT_TYPES)}"
    return None


def xla_compute_op(op: ir.Operation) -> str | None:
    """a static-shaped stablehlo/chlo op or arith.constant (no side effects, tokens, collectives, rng, custom_call)"""
    dialect = op.name.split(".", 1)[0]
    if op.name == "arith.constant":
        return _types_ok(op)
    if dialect not in _DIALECTS:
        return f"{op.name} is not a stablehlo or chlo op"
    if op.name in EXCLUDED:
        return f"{op.name}: {EXCLUDED[op.name]}"
    if not op.results:
        return f"{op.name} has no results"
    foreign = [name for name in op.attributes if not name.startswith("collage.") and
               set(_ATTR_DIALECT.findall(str(op.attributes[name]))) - set(_DIALECTS)]
    if foreign:  # e.g. IREE's lowering_config: XLA's parser does not know the dialect
        return f"{op.name}: carries dialect attributes XLA cannot parse ({', '.join(foreign)})"
    return _types_ok(op)


def nested_ops_supported(op: ir.Operation) -> str | None:
    """nested bodies (reduce, sort, while, ...) hold only supported ops"""
    why: list[str] = []

    def visit(o: ir.Operation) -> ir.WalkResult:
        o = o.operation
        if o == op or o.name in _TERMINATORS:
            return ir.WalkResult.ADVANCE
        reason = xla_compute_op(o)
        if reason:
            why.append(f"{op.name} body: {reason}")
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    if any(len(r.blocks) for r in op.regions):
        op.walk(visit)
    return why[0] if why else None


# --- build: region function -> standalone StableHLO module -----------------------------------------

_RESOURCE_SECTION = re.compile(r"\{-#.*?#-\}", re.S)
_RESOURCE_REF = re.compile(r"^dense_resource<(.*)>\s*:")


def _strip_collage_attrs(op: ir.Operation) -> None:
    attrs = op.attributes
    for name in [attrs[k].name for k in range(len(attrs)) if attrs[k].name.startswith("collage.")]:
        del attrs[name]


def region_module(func: ir.Operation) -> ir.Module:
    """The region function ``func`` as a standalone module XLA accepts (see the module docstring), in
    ``func``'s context."""
    func = func.operation
    with func.context, ir.Location.unknown():
        module = ir.Module.create()
        fn = func.clone(ip=ir.InsertionPoint(module.body)).operation
        fn.attributes["sym_name"] = ir.StringAttr.get("main")
        fn.attributes["sym_visibility"] = ir.StringAttr.get("public")
        ops: list[ir.Operation] = []
        fn.walk(lambda o: ops.append(o.operation) or ir.WalkResult.ADVANCE)
        for op in ops:
            _strip_collage_attrs(op)
        constants = [op for op in ops if op.name in ("stablehlo.constant", "arith.constant")]
        for op, blob in zip(constants, sh.resource_arrays(constants)):
            value = op.attributes["value"]
            m = _RESOURCE_REF.match(str(value))
            if m:
                if blob is None:
                    raise ValueError(f"dense_resource {m.group(1)} has no readable blob (was it elided?)")
                value = (ir.DenseElementsAttr.get(blob, type=op.results[0].type) if blob.dtype.kind in "fiu"
                         else ir.Attribute.parse(f'dense<"0x{blob.tobytes().hex()}"> : {op.results[0].type}'))
            if op.name == "arith.constant" or m:
                with ir.InsertionPoint(op), op.location:
                    new = ir.Operation.create("stablehlo.constant", results=[op.results[0].type],
                                              attributes={"value": value})
                op.results[0].replace_all_uses_with(new.results[0])
                op.erase()
    return module


def region_module_text(func: ir.Operation) -> str:
    """``region_module(func)`` as text (weights as hex: twice their size)."""
    text = region_module(func).operation.get_asm(enable_debug_info=False)
    return _RESOURCE_SECTION.sub("", text)


def region_module_bytecode(func: ir.Operation) -> bytes:
    """``region_module(func)`` as MLIR bytecode, which XLA's parser reads as it reads text: weights as raw
    bytes (BERT-base: 435 MB against 870 MB of text, loaded in 2.3 GB against 3.6 GB)."""
    buf = io.BytesIO()
    region_module(func).operation.write_bytecode(buf)
    return buf.getvalue()


def jaxlib_parse_error(module: bytes | str) -> str | None:
    """Why jaxlib's MLIR (the parser XLA's PJRT client runs at load) cannot read ``module``, else None.
    IREE's MLIR is newer than jaxlib's: its bytecode of a ``chlo.top_k`` (JAX's ``lax.top_k``) reads back
    as "expected mlir::IntegerAttr", which jaxlib only said at run time, as "Failed to parse using
    StableHLO v1.17.0"."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir as jax_ir

    with jax_mlir.make_ir_context():
        try:
            jax_ir.Module.parse(module)
        except Exception as exc:  # noqa: BLE001  jaxlib raises MLIRError or ValueError
            lines = [line.strip() for line in str(exc).splitlines() if "error" in line]
            return " ".join((lines[0] if lines else str(exc)).split())[:300]
    return None


class XlaCpuBackend(OpSetBackend):
    name = "xla-cpu"
    kind = BackendKind.GRAPH
    install_hint = "pip install 'collage-mlir[xla]'"
    # Measured against IREE llvm-cpu on the shapes of test/python/backends/test_xla_cpu.py: ResNet-50 3x3 conv
    # (1x64x56x56) and strided 1x1 (256->512, stride 2) bit-identical; MobileNetV2 depthwise max abs
    # 4.8e-7 (rel 1.1e-5); BERT-ish matmul + GELU 2.4e-7 (rel 4.4e-6); softmax 1.2e-7; layer norm 7.2e-7
    # (rel 7.9e-6); reductions over 512 elements max abs 4.4e-5 at |y| up to 72, rel up to 1.8e-4 only
    # where sums nearly cancel (|y| < 0.3). Worst rtol needed at atol 1e-5 is 3.2e-6, so the same
    # tolerance as oneDNN (rtol 1e-4, atol 1e-5) leaves a 30x margin.
    tolerance = Tolerance(rtol=1e-4, atol=1e-5)
    patterns = (OpPattern("xla-op", None, (xla_compute_op, nested_ops_supported)),)

    requires = ("jax", "jaxlib")

    def version(self) -> str:
        try:
            from jaxlib import version
        except ImportError:
            return "unknown"
        return f"jaxlib-{version.__version__}"

    def build(self, func: ir.Operation, out_dir: Path, region: str) -> RegionArtifact:
        """Writes the region module as bytecode, or as text where jaxlib cannot read IREE's bytecode of it;
        one jaxlib cannot read either way fails here, at compile time, not when the program loads."""
        path = Path(out_dir) / "regions" / f"{region}.xla.mlirbc"
        data = region_module_bytecode(func)
        if jaxlib_parse_error(data) is not None:
            path, data = path.with_suffix(".mlir"), region_module_text(func)
            if (why_text := jaxlib_parse_error(data)) is not None:
                raise CollageError(f"{func.location}: XLA (jaxlib {self.version()}) cannot read this region: "
                                   f"{why_text}; leave the region to another backend")
            data = data.encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return RegionArtifact(str(path.relative_to(out_dir)), "collage_runtime.executors.xla_pjrt")

