"""The ONNX graph under construction (``_Builder``: nodes, initializers, subgraphs in scopes of their own)
and the walk that translates a block's ops into it by the op table's rules (``_translate_ops``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..dialects import collage
from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir
from .op_ids import _ids_doc
from .registry import OPS, dynamic, known_types, static_known_types, static_moved_types
from .values import DTYPES


class _Builder:
    def __init__(self, ties_by_index: bool = True, dynamic: bool = False):
        from onnx import helper

        self.helper = helper
        self.nodes: list = []
        self.initializers: list = []
        self.count = 0
        self.constants: dict = {}
        #: The ONNX name of each StableHLO value translated so far (in scope: a loop body sees its graph's).
        self.names: dict[ir.Value, str] = {}
        #: Whether the engine's ``TopK`` keeps the lower index first among equal values, as ONNX specifies
        #: (ONNX Runtime does; OpenVINO does not, and gets a second, tie-breaking ``TopK``: ``_ordered_top_k``).
        self.ties_by_index = ties_by_index
        #: The ``collage.id`` of the op being translated (a nested op's: its numbered ancestor's).
        self.op_id: int | None = None
        #: The opset of each domain and the IR version the graph needs at least (a kept ONNX node's; beyond
        #: them, the translator's own).
        self.opsets: dict[str, int] = {}
        self.ir_version = 0
        #: Values may have dynamic dims (``translate(dynamic=True)``): an op with one needs a rule that takes
        #: them (``OnnxOp.dynamic``), held to ``known_types`` instead of ``static_known_types`` (or ``static_moved_types``).
        self.dynamic = dynamic
        #: Broadcasts left to ONNX's implicit broadcasting (a dynamic translation's): the name of a tensor
        #: of the broadcast's rank whose dims are 1 or the result's → its shape operand (i32 or i64). A rule
        #: that broadcasts (``OnnxOp.broadcasts``) takes it as it is (its result unexpanded too where every
        #: operand is); any other gets it ``Expand``ed (``expanded``), as do the graph's outputs.
        self.lazy: dict[str, str] = {}
        self._expanded: dict[str, str] = {}

    def expanded(self, name: str) -> str:
        """``name``, or where it is a broadcast left to the consumer (``lazy``), the ``Expand`` to its shape
        (one per name)."""
        if name not in self.lazy:
            return name
        if name not in self._expanded:
            shape = self.node("Cast", [self.lazy[name]], to=DTYPES["i64"][1])
            self._expanded[name] = self.node("Expand", [name, shape])
        return self._expanded[name]

    def fresh(self, hint: str = "t") -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def node(self, op_type: str, inputs: list[str], **attrs) -> str:
        """Adds a node; its (only) output's name."""
        (out,) = self.multi_node(op_type, inputs, 1, **attrs)
        return out

    def multi_node(self, op_type: str, inputs: list[str], n_out: int, also: tuple[int, ...] = (), **attrs) -> list[str]:
        """Adds a node with ``n_out`` outputs; their names. ``also``: the ids of other ops the node computes
        (beside the op being translated), for the profiles that charge a node's time to ops."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(op_type, inputs, outs, name=outs[0], doc_string=_ids_doc(
            (*(() if self.op_id is None else (self.op_id,)), *also)), **attrs))
        return outs

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))  # keeps rank 0
        return name

    def ints(self, values, hint: str = "shape") -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint)

    def transpose(self, x: str, perm: list[int]) -> str:
        return x if perm == sorted(perm) else self.node("Transpose", [x], perm=list(perm))

    def reshape(self, x: str, shape, current=None) -> str:
        if current is not None and tuple(current) == tuple(shape):
            return x
        return self.node("Reshape", [x, self.ints(shape)])

    def graph(self, name: str, inputs: list[tuple[str, str, list[int]]],
              build: Callable[[], list[tuple[str, str, list[int]]]]):
        """An ONNX subgraph (a ``Loop`` body) that ``build`` fills in a scope of its own: its nodes and
        constants are its own, it reads this graph's values by name (outer-scope references), and the
        names it gives StableHLO values are forgotten after it. ``inputs`` and what ``build`` returns are
        (name, element type, shape) of its inputs and outputs (each output written by an ``Identity``)."""
        helper = self.helper
        saved = self.nodes, self.initializers, dict(self.names), dict(self._expanded)
        self.nodes, self.initializers = [], []
        try:
            outputs = []
            for value, dtype, shape in build():
                out = self.node("Identity", [value])
                outputs.append(helper.make_tensor_value_info(out, DTYPES[dtype][1], shape))
            return helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(n, DTYPES[d][1], s)
                                                        for n, d, s in inputs], outputs, initializer=self.initializers)
        finally:  # an Expand made inside is the subgraph's own
            self.nodes, self.initializers, self.names, self._expanded = saved


def _translate_ops(b: _Builder, ops: list[ir.Operation]) -> None:
    """Translates ``ops`` in order into ``b``, naming their results in ``b.names``; an op without a
    translation, or failing its constraints, is one CollageError naming it."""
    for op in ops:
        spec = OPS.get(op.name)
        when = () if spec is None else spec.when
        if spec is not None and b.dynamic and dynamic(op):
            when = (lambda o: None if spec.dynamic else f"{o.name} has no translation with dynamic dims",
                    *(known_types if c in (static_known_types, static_moved_types) else c for c in when))
        why = f"{op.name} has no ONNX translation" if spec is None else \
            next((r for r in (c(op) for c in when) if r), None)
        if why:
            raise CollageError(f"{op.location}: cannot export to ONNX: {why}" + ("" if op.name in why else f" ({op.name})"))
        outer, oid = b.op_id, collage.op_id(op)
        b.op_id = outer if oid is None else oid
        try:
            ins = [b.names[v] for v in op.operands]
            # Broadcasting commutes with elementwise ops: on unexpanded operands only, the result is itself
            # unexpanded (each dim the result's or 1), its shape the operands'.
            lazy = b.lazy.get(ins[0]) if ins and spec.broadcasts and all(n in b.lazy for n in ins) else None
            if b.lazy and not spec.broadcasts:
                ins = [b.expanded(n) for n in ins]
            for r, name in zip(op.results, spec.translate(b, op, ins)):
                b.names[r] = name
                if lazy is not None:
                    b.lazy[name] = lazy
        finally:
            b.op_id = outer


def _block_results(b: _Builder, block: ir.Block, args: list[str]) -> list[str]:
    """The names of what ``block`` returns, its arguments named ``args``, its ops translated into ``b``."""
    for arg, name in zip(block.arguments, args):
        b.names[arg] = name
    _translate_ops(b, sh.block_ops(block))
    return [b.expanded(b.names[v]) for v in sh.returned(block)]
