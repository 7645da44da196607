"""Region extraction: a candidate region (a convex set of op ids) as a standalone module.

The module's ``@main`` has the region's semantics: the values flowing in become arguments (in first-use
order), the values used after the region become results (in op order). Constant expressions flowing in
(weights, ``dense_resource`` blobs included; torch-mlir's scalars) are cloned in as constants, as the
region sees them in the model: a codegen backend folds or pre-packs them, outlining embeds them in a
graph engine's region and hands them to a library backend as arguments, so a region measured alone pays
what it pays in the program.

Each extracted region has a *structural hash* over its ops, attributes, shapes and dtypes (not SSA
names, locations, op ids, nor the values of large constants, which change no timing), so the same
conv in two models is the same region for the cost database.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass

from iree.compiler.dialects import func as func_d

from ..backends import Precision
from ..dialects import collage
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..graph import Graph, external_operands, nested_ops, remap_operands
from ..ir import ir
from ..plan import Plan, Region

#: Constants with at most this many elements keep their values in the structural hash (they carry
#: semantics: a relu's zero, a clamp's bounds); larger ones count by type only.
HASHED_ELEMENTS = 64

#: Version of ``structural_hash``'s rule: the DB's cache of (module, op set) -> hash is keyed by it, so
#: bump it whenever a change would give a region another hash.
HASH_VERSION = 2

QUANTIZE = "stablehlo.uniform_quantize"

#: Why a region is not extracted alone when a quantized tensor flows in or out (a quantize op alone): it
#: is measured only inside a region that also holds the ops on the tensor's other side.
QUANTIZED_BOUNDARY = "a quantized tensor would cross its boundary: measured only with its neighbours"
#: Why a region none of whose results is used is not extracted (compilers drop it: it costs nothing).
DEAD_CODE = "has no result used after it (dead code): nothing to measure"

_COLLAGE_ATTRS = (collage.ID, collage.REGION, collage.BACKEND)


@dataclass(frozen=True)
class ValueRef:
    """A value of the model: result ``index`` of op ``op`` (an op id), or argument ``index`` of public
    function ``func`` when ``op`` is None. Stable across re-parses of the numbered module."""

    func: str
    op: int | None
    index: int

    def key(self) -> str:
        return f"{self.func}:arg{self.index}" if self.op is None else f"op{self.op}:{self.index}"


@dataclass(frozen=True)
class ExtractedRegion:
    """A region as a standalone module (``bytecode``, MLIR bytecode with its weights) and how it sits
    in the model: ``inputs`` feed ``@main``'s arguments and ``outputs`` are its results."""

    ops: frozenset[int]
    bytecode: bytes
    hash: str
    summary: str
    inputs: tuple[ValueRef, ...]
    outputs: tuple[ValueRef, ...]
    #: ``@main``'s first ``const_ops`` ops are the cloned constant expressions; the region's ``body_ops``
    #: ops follow (``len(ops)`` but for the quantize/dequantize ops a float region loses).
    const_ops: int
    body_ops: int
    #: Whether the region quantizes (holds a ``uniform_quantize``): validated with ``validate.QUANT_RTOL``.
    quantized: bool = False
    #: ``FLOAT``: the module is the region's float form (``dialects.stablehlo.dequantize_pairs``).
    precision: Precision = Precision.MODEL

    def plan(self, backend: str, default_backend: str) -> Plan:
        """The plan that runs this module's region (all but the cloned constants) on ``backend``, in a program
        whose default backend is ``default_backend``."""
        ids = frozenset(range(self.const_ops, self.const_ops + self.body_ops))
        return Plan([Region("region", backend, ids)], default_backend, f"region {self.hash[:12]} on {backend}")


def value_ref(graph: Graph, value: ir.Value) -> ValueRef:
    """The ``ValueRef`` naming ``value`` (a public function's argument or a numbered op's result)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        func = owner.owner.operation
        return ValueRef(collage.symbol_name(func), None, ir.BlockArgument(value).arg_number)
    op = owner.operation
    oid = collage.op_id(op)
    if oid is None or oid not in graph.nodes:
        raise CollageError(f"{op.name} feeding a region is not a numbered top-level op")
    return ValueRef(graph.nodes[oid].func, oid, ir.OpResult(value).result_number)


def extract_region(graph: Graph, ids: frozenset[int], precision: Precision = Precision.MODEL) -> ExtractedRegion:
    """Extracts the convex region ``ids`` of ``graph`` (a numbered module) into a standalone module (in its
    float form for ``Precision.FLOAT``: what a float plan region builds)."""
    if not graph.is_convex(ids):
        raise CollageError(f"ops {sorted(ids)} are not a convex region of one function")
    order = graph.topological_order()
    rank = {oid: k for k, oid in enumerate(order)}
    ops = [graph.nodes[i].op for i in sorted(ids, key=rank.__getitem__)]
    inside = {o for op in ops for o in nested_ops(op)}
    free = external_operands(ops)
    consts = [(v, chain) for v in free if (chain := sh.const_expr_ops(v, readable=False)) is not None]
    args = [v for v in free if not any(v == c for c, _ in consts)]
    outputs = [r for op in ops for r in op.results if any(u.owner.operation not in inside for u in r.uses)]
    if not outputs:
        raise CollageError(f"region {sorted(ids)} {DEAD_CODE}")
    quantized = next((v for v in (*args, *outputs) if "!quant." in str(v.type)), None)
    if quantized is not None:  # no program takes or returns one (``backends.base.crossing_type_problem``)
        raise CollageError(f"{QUANTIZED_BOUNDARY} ({quantized.type}; region {sorted(ids)})")

    with ops[0].context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func_d.FuncOp("main", ir.FunctionType.get([v.type for v in args], [v.type for v in outputs]))
            entry = fn.add_entry_block()
        mapping: list[tuple[ir.Value, ir.Value]] = list(zip(args, entry.arguments))
        clones: list[ir.Operation] = []
        for v, chain in consts:
            clones += sh.clone_const_expr(chain, ir.InsertionPoint(entry))
            mapping.append((v, clones[-1].results[0]))
        n_const = len(clones)
        for op in ops:
            clone = op.clone(ip=ir.InsertionPoint(entry))
            clones.append(clone)
            mapping.extend(zip(op.results, clone.results))
            remap_operands(clone, mapping)
        for clone in clones:
            for attr in _COLLAGE_ATTRS:
                if attr in clone.attributes:
                    del clone.attributes[attr]
        n_body = len(ops)
        with ir.InsertionPoint(entry):
            func_d.ReturnOp([next(n for o, n in mapping if o == v) for v in outputs])
        if precision is Precision.FLOAT:  # (its clamps go before their dequantize ops: into the body)
            dead = sh.dequantize_pairs(clones)
            n_const -= sum(any(c == d for d in dead) for c in clones[:n_const])
            for op in dead:
                op.erase()
            n_body = len(entry.operations) - 1 - n_const
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        bytecode = buf.getvalue()
        digest = structural_hash(module)
    summary = ", ".join(f"{graph.nodes[i].name.removeprefix('stablehlo.')}" for i in sorted(ids, key=rank.__getitem__))
    return ExtractedRegion(frozenset(ids), bytecode, digest, summary,
                           tuple(value_ref(graph, v) for v in args), tuple(value_ref(graph, v) for v in outputs),
                           n_const, n_body, any(graph.nodes[i].name == QUANTIZE for i in ids), precision)


_RESOURCE_USE = re.compile(r"dense_resource<([^>]+)>")
_RESOURCE_BLOB = re.compile(r'^\s*"?([^":\s]+)"?\s*:\s*"0x([0-9A-Fa-f]*)"', re.M)


def structural_hash(module: ir.Module) -> str:
    """SHA-256 of the module's ops, attributes and types, without locations or SSA names. Small
    constants count by value (also ``dense_resource`` blobs, whose names differ between models); larger
    ones by type only."""
    limit = HASHED_ELEMENTS * 8 + 16
    with collage.OnnxSource.detached(module):  # where the model was read from is not what it computes
        text = module.operation.get_asm(large_elements_limit=HASHED_ELEMENTS, large_resource_limit=limit)
    body, _, resources = text.partition("{-#")
    blobs = {name: hashlib.sha256(data.encode()).hexdigest()[:16] for name, data in _RESOURCE_BLOB.findall(resources)}
    body = _RESOURCE_USE.sub(lambda m: f"dense_resource<{blobs.get(m.group(1), 'elided')}>", body)
    return hashlib.sha256(body.encode()).hexdigest()
