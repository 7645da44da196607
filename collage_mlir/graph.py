"""Dataflow view over a module's public functions: op ids, edges, topological order, convexity.

A *region* is a set of op ids of one function. It is convex when no path leaves the set and
comes back into it, which is what lets it be outlined into one function call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Iterable, Iterator

import networkx as nx
from collage_runtime.types import TensorSpec

from .dialects import collage
from .dialects.stablehlo import fold_identity_ops, fold_splat_math, split_complex_constants
from .ir import ir, location_text


@dataclass(frozen=True)
class OpNode:
    """One top-level op of a public function."""

    id: int
    name: str
    func: str
    op: ir.Operation

    @property
    def location(self) -> str:
        return location_text(self.op.location)


def module_block(module: ir.Module | ir.Operation) -> ir.Block:
    """The body block of a module given as ir.Module or as its builtin.module operation."""
    return module.operation.regions[0].blocks[0]


def public_funcs(module: ir.Module | ir.Operation) -> Iterator[ir.Operation]:
    for op in module_block(module).operations:
        if collage.is_public_func(op):
            yield op.operation


def main_func(module: ir.Module | ir.Operation) -> ir.Operation | None:
    """The module's public @main function; None where it has none."""
    return next((f for f in public_funcs(module) if collage.symbol_name(f) == "main"), None)


def main_type(module: ir.Module) -> ir.FunctionType | None:
    """The type of the module's public @main function; None where it has none."""
    func = main_func(module)
    return None if func is None else ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)


def main_inputs(module: ir.Module) -> list[TensorSpec | None]:
    """The @main function's arguments as the compiled program's signature states them (None: not a ranked
    tensor); empty where the module has no public @main."""
    func_type = main_type(module)
    types = [] if func_type is None else func_type.inputs
    ranked = [ir.RankedTensorType(t) if isinstance(t, ir.RankedTensorType) else None for t in types]
    return [None if t is None else TensorSpec(tuple(None if t.is_dynamic_dim(a) else t.shape[a] for a in range(t.rank)),
                                              str(t.element_type)) for t in ranked]


def body_ops(func: ir.Operation) -> Iterator[ir.Operation]:
    """Top-level ops of a function body, without the terminator."""
    block = func.regions[0].blocks[0]
    for op in block.operations:
        op = op.operation
        if op.name != "func.return":
            yield op


def number_ops(module: ir.Module | ir.Operation) -> None:
    """Gives every top-level op of every public function a stable ``collage.id``: functions in module
    order, ops in block order, from 0, so the same module text always gets the same ids and plans written
    against it stay valid. Complex constants are split into real and imaginary parts first
    (``stablehlo.split_complex_constants``): the Python bindings cannot read them, and every later step
    reads constants; float math on splat constants is folded (``stablehlo.fold_splat_math``: a GELU's
    ``rsqrt(2)`` is a constant every region reads, not a tensor crossing region boundaries), and ops that
    return their operand unchanged dropped (``stablehlo.fold_identity_ops``: nothing to place). Idempotent."""
    with module.operation.context:
        split_complex_constants(module)
        fold_splat_math(module)
        fold_identity_ops(module)
        next_id = 0
        for func in public_funcs(module):
            for op in body_ops(func):
                collage.set_op_id(op, next_id)
                next_id += 1


def nested_ops(op: ir.Operation) -> list[ir.Operation]:
    """``op`` and every op inside its regions."""
    if not len(op.regions):  # most ops: no walk (a Python callback per op)
        return [op.operation]
    found: list[ir.Operation] = []

    def visit(o: ir.Operation) -> ir.WalkResult:
        found.append(o.operation)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def external_operands(ops: Iterable[ir.Operation]) -> list[ir.Value]:
    """Values used by ``ops`` (or ops nested inside them) that none of them defines, in first-use order."""
    ops = list(ops)
    inside = set()
    for op in ops:
        for o in nested_ops(op):
            inside.add(o)
    seen: dict[ir.Value, None] = {}  # values hash by the value they stand for: first-use order, once each
    for op in ops:
        for o in nested_ops(op):
            for v in o.operands:
                if v in seen:
                    continue
                owner = v.owner
                if isinstance(owner, ir.Block):
                    owner = owner.owner
                if owner.operation not in inside:
                    seen[v] = None
    return list(seen)


def remap_operands(op: ir.Operation, mapping: list[tuple[ir.Value, ir.Value]]) -> None:
    """Replaces, in ``op`` and the ops nested in it, every operand that is an old value of ``mapping``
    (old, new) pairs by its new value (ir.Value is not hashable, hence pairs)."""
    for o in nested_ops(op):
        for i, operand in enumerate(o.operands):
            for old, new in mapping:
                if operand == old:
                    o.operands[i] = new
                    break


def producer(value: ir.Value) -> ir.Operation | None:
    """The op that defines ``value``, or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


#: The ops whose operands' precision is a region's (``region_precision``).
COMPUTE_OPS = frozenset({"stablehlo.dot_general", "stablehlo.convolution"})


class Precision(str, Enum):
    """What a region computes in. ``MODEL``: as the model says (its quantize/dequantize pairs kept: int8
    where they quantize); ``FLOAT``: each ``uniform_dequantize(uniform_quantize(x))`` in the region is
    ``x`` (float math on the quantized weights' values; ``passes.float_regions``)."""

    MODEL = "model"
    FLOAT = "float"



def region_precision(graph: "Graph", ids, precision: Precision = Precision.MODEL) -> str:
    """The precision a region computes in: ``int8`` where a matmul or convolution in it reads a dequantized
    (``!quant.uniform``) value and the region keeps the model's precision, else its matmuls' and
    convolutions' result element type (``f32``, ``f16``...); ``-`` where it has none."""
    ops = [graph.nodes[i].op for i in sorted(ids) if i in graph.nodes and graph.nodes[i].name in COMPUTE_OPS]
    if not ops:
        return "-"
    for op in ops if precision is Precision.MODEL else ():
        for v in op.operands:
            p = producer(v)
            if p is not None and p.name == "stablehlo.uniform_dequantize":
                return "int8" if "<i8" in str(p.operands[0].type) or "<u8" in str(p.operands[0].type) else "quantized"
    return str(ir.RankedTensorType(ops[0].results[0].type).element_type)


@dataclass(frozen=True)
class Boundary:
    """What crosses the edge of a region: its top-level ops (in id order), every op inside them (nested
    ones too), the values flowing in (``external_operands``: first-use order) and the results used outside."""

    ops: tuple[ir.Operation, ...]
    inside: frozenset[ir.Operation]
    inputs: tuple[ir.Value, ...]
    outputs: tuple[ir.Value, ...]


class Graph:
    """Op ids → nodes, with the dataflow edges between them (networkx DiGraph, one per module).

    A snapshot: ``boundary`` and ``region_fact`` remember what they computed, so the module must not be
    changed while its graph is in use (the passes that change a module make a new graph after)."""

    def __init__(self, module: ir.Module | ir.Operation):
        self.module = module
        self.nodes: dict[int, OpNode] = {}
        self.dag = nx.DiGraph()
        for func in public_funcs(module):
            fname = collage.symbol_name(func)
            for op in body_ops(func):
                oid = collage.op_id(op)
                if oid is None:
                    continue
                self.nodes[oid] = OpNode(oid, op.name, fname, op)
                self.dag.add_node(oid)
        for oid, node in self.nodes.items():
            for v in external_operands([node.op]):
                p = producer(v)
                pid = collage.op_id(p) if p is not None else None
                if pid is not None and pid in self.nodes:
                    self.dag.add_edge(pid, oid)
        self._order = {oid: i for i, oid in enumerate(nx.lexicographical_topological_sort(self.dag))}
        self._edges = list(self.dag.edges)
        self._boundaries: dict[frozenset[int], Boundary] = {}
        self._facts: dict[tuple[object, frozenset[int]], object] = {}

    def boundary(self, ids: frozenset[int]) -> Boundary:
        """The region ``ids``' boundary (remembered: every backend's checks of one region share it)."""
        found = self._boundaries.get(ids)
        if found is None:
            ops = tuple(self.nodes[i].op for i in sorted(ids))
            inside = frozenset(o for op in ops for o in nested_ops(op))
            outputs = tuple(r for op in ops for r in op.results if any(u.owner.operation not in inside for u in r.uses))
            found = self._boundaries[ids] = Boundary(ops, inside, tuple(external_operands(ops)), outputs)
        return found

    def region_fact(self, check, ids: frozenset[int]):
        """``check(self, ids)``, remembered per check and region: for facts of a region that do not depend
        on the backend asking (whether a call boundary around it can exist), asked by several backends."""
        key = (check, ids)
        if key not in self._facts:
            self._facts[key] = check(self, ids)
        return self._facts[key]

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def dequantizing(self) -> frozenset[int]:
        """The ``uniform_dequantize`` ops: a region holding one has a float form (``Precision.FLOAT``)."""
        return frozenset(i for i, n in self.nodes.items() if n.name == "stablehlo.uniform_dequantize")

    def topological_order(self) -> list[int]:
        """Op ids in a deterministic topological order (ties broken by id)."""
        return sorted(self._order, key=self._order.__getitem__)

    def users(self, oid: int) -> list[int]:
        return sorted(self.dag.successors(oid))

    def producers(self, oid: int) -> list[int]:
        return sorted(self.dag.predecessors(oid))

    def is_convex(self, ids: Iterable[int]) -> bool:
        """True when the ops are in one function and no dataflow path leaves the set and re-enters it."""
        region = set(ids)
        if not region or len({self.nodes[i].func for i in region}) > 1:
            return False
        outside_successors = {s for i in region for s in self.dag.successors(i)} - region
        reached = set(outside_successors)
        frontier = list(outside_successors)
        hi = max(self._order[i] for i in region)
        while frontier:
            n = frontier.pop()
            if n in region:
                return False
            for s in self.dag.successors(n):
                # Nodes past the region's last op in topological order cannot lead back into it.
                if s not in reached and self._order[s] <= hi:
                    reached.add(s)
                    frontier.append(s)
        return True

    def regions_acyclic(self, regions: Iterable[Iterable[int]]) -> bool:
        """True when collapsing each region to one node leaves the dataflow acyclic: two regions, each
        convex, can still feed each other (A → B → A) and then neither call can go first. Kahn's algorithm
        on the quotient, in plain dicts (a networkx quotient per call was 3 s of a warm search's 10)."""
        label: dict[int, int] = {}
        for k, region in enumerate(regions):
            for i in region:
                label[i] = -1 - k  # op ids are >= 0
        succ: dict[int, set[int]] = {}
        indegree: dict[int, int] = {}
        for a, b in self._edges:
            la, lb = label.get(a, a), label.get(b, b)
            if la != lb and lb not in (out := succ.setdefault(la, set())):
                out.add(lb)
                indegree[lb] = indegree.get(lb, 0) + 1
        ready = [n for n in succ if n not in indegree]
        while ready:
            for m in succ.get(ready.pop(), ()):
                indegree[m] -= 1
                if indegree[m] == 0:
                    ready.append(m)
        return not any(indegree.values())
