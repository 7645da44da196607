"""The `collage` vocabulary: discardable attributes, since IREE's context has no Python-defined dialects.

- ``collage.id``      (i64 on an op): the op's stable number, set by ``collage-number-ops``.
- ``collage.backend`` (string on an op or an outlined func): which backend runs it.
- ``collage.region``  (string on an op or an outlined func): the plan region it belongs to.
- ``collage.artifact`` (string on a lowered import): the region artifact file, relative to the artifact dir.
- ``collage.executor`` (string on a lowered import): the runtime executor registered for its backend.
- ``collage.devices`` (array of dictionaries on the module): the program's IREE devices, set by
  ``collage-place-devices`` (name, ordinal, backends, executable target).
- ``collage.iree_flags`` (array of strings on the module): IREE flags the program needs (a second device).
- ``collage.float64`` (unit on the module): float64 crosses its signature or a kept node: no f64 demotion.
- ``collage.onnx_tail`` (dictionary on the module): ONNX nodes run after ``@main`` (``OnnxTail``).
- ``collage.onnx_source`` (dictionary on the module): the ONNX file ``@main`` was imported from (``OnnxSource``).

One op form is collage's own: ``stablehlo.custom_call @collage.onnx_node`` is an ONNX node kept as ONNX (an
op the ONNX importer cannot lower), its ``backend_config`` the node as a one-node ONNX model (inputs
``in0..``, outputs ``out0..``; base64). Only an ONNX engine runs it (``backends.pinned_backend``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from collage_runtime.manifest import sha256_file

from ..ir import ir

ID = "collage.id"
BACKEND = "collage.backend"
REGION = "collage.region"
#: On an op of a plan region whose precision is not the model's (``float``), until ``collage-float-regions``.
PRECISION = "collage.precision"
ARTIFACT = "collage.artifact"
EXECUTOR = "collage.executor"
DEVICES = "collage.devices"
IREE_FLAGS = "collage.iree_flags"

#: ``call_target_name`` of an ONNX node kept as ONNX.
ONNX_NODE = "collage.onnx_node"

#: Module unit attribute: the model computes in float64 where it says so. Set where float64 crosses a public
#: function's signature or a kept ONNX node's boundary (the source declares it); the program is then
#: compiled without IREE's default demotion of f64 to f32, which would change its signature and refuse
#: an external function (a kept node) taking f64. Elsewhere IREE demotes as usual (torch's f64 variance
#: in a float32 LayerNorm stays f32).
FLOAT64 = "collage.float64"

#: Symbol prefix of imports served by the runtime's `collage_rt` VM module.
RT_MODULE = "collage_rt"


def op_id(op: ir.Operation) -> int | None:
    """The op's ``collage.id``, or None if it was never numbered."""
    op = op.operation
    if ID not in op.attributes:
        return None
    return ir.IntegerAttr(op.attributes[ID]).value


def set_op_id(op: ir.Operation, value: int) -> None:
    op.operation.attributes[ID] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def is_onnx_node(op: ir.Operation) -> bool:
    """Whether ``op`` is an ONNX node kept as ONNX (``stablehlo.custom_call @collage.onnx_node``)."""
    op = op.operation
    return op.name == "stablehlo.custom_call" and str_attr(op, "call_target_name") == ONNX_NODE


def onnx_node_model(op: ir.Operation) -> bytes | None:
    """The one-node ONNX model an ``@collage.onnx_node`` custom call holds; None for any other op."""
    return base64.b64decode(str_attr(op, "backend_config") or "") if is_onnx_node(op) else None


def onnx_node_attributes(model: bytes) -> dict[str, ir.Attribute]:
    """The attributes of an ``@collage.onnx_node`` custom call holding ``model``."""
    return {"call_target_name": ir.StringAttr.get(ONNX_NODE),
            "backend_config": ir.StringAttr.get(base64.b64encode(model).decode("ascii")),
            "has_side_effect": ir.BoolAttr.get(False)}


#: Module attribute: the ONNX tail of an imported model (``OnnxTail``).
ONNX_TAIL = "collage.onnx_tail"


@dataclass(frozen=True)
class OnnxTail:
    """ONNX nodes of an imported model that run after ``@main`` on ONNX Runtime (``frontends.onnx_tail``): a
    node whose output shape depends on its data and every node after it. ``model``: them as an ONNX model;
    ``inputs``/``outputs``: as ``collage_runtime.manifest.TailEntry`` says (``("result", k)``: main's k-th
    result, ``("arg", i)``: its i-th argument, ``("tail", j)``: the model's j-th output)."""

    model: bytes
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]

    def attach(self, module: ir.Module) -> None:
        with module.context:
            module.operation.attributes[ONNX_TAIL] = _to_attr({
                "model": base64.b64encode(self.model).decode("ascii"),
                "inputs": [list(s) for s in self.inputs], "outputs": [list(s) for s in self.outputs]})

    @classmethod
    def of(cls, module: ir.Module | ir.Operation) -> "OnnxTail | None":
        """The tail attached to ``module``, or None."""
        data = json_attr(module.operation, ONNX_TAIL)
        if data is None:
            return None
        return cls(base64.b64decode(data["model"]), tuple((k, i) for k, i in data["inputs"]),
                   tuple((k, i) for k, i in data["outputs"]))

    @staticmethod
    def detach(module: ir.Module | ir.Operation) -> None:
        """Drops the tail of ``module`` (a copy made to capture ``@main``'s own results)."""
        if ONNX_TAIL in module.operation.attributes:
            del module.operation.attributes[ONNX_TAIL]


ONNX_SOURCE = "collage.onnx_source"


@dataclass(frozen=True)
class OnnxSource:
    """The ONNX file a module's ``@main`` computes exactly (set by the ONNX frontend where no tail was split
    off): ``path``, its ``sha256`` when imported, and ``dims``, the values its dynamic dims were fixed to for
    the import (a shape bucket's). An ONNX engine whose region is all of ``@main`` runs this file instead of
    the region's translation (``backends.onnx_engine``): the engine's own graph fusions match its own
    exporter's patterns, not the translation's."""

    path: str
    sha256: str
    dims: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of_file(cls, path: str | Path, dims: tuple[tuple[str, int], ...] = ()) -> "OnnxSource":
        return cls(str(Path(path).resolve()), sha256_file(Path(path)), dims)

    def attach(self, module: ir.Module) -> None:
        with module.context:
            module.operation.attributes[ONNX_SOURCE] = _to_attr(
                {"path": self.path, "sha256": self.sha256, "dims": [[n, v] for n, v in self.dims]})

    @classmethod
    def of(cls, module: ir.Module | ir.Operation) -> "OnnxSource | None":
        """The source attached to ``module``, or None."""
        data = json_attr(module.operation, ONNX_SOURCE)
        if data is None:
            return None
        return cls(data["path"], data["sha256"], tuple((n, v) for n, v in data["dims"]))

    def unchanged(self) -> bool:
        """Whether the file is still there with the content it was imported from."""
        return Path(self.path).is_file() and sha256_file(Path(self.path)) == self.sha256

    @staticmethod
    def detach(module: ir.Module | ir.Operation) -> None:
        """Drops the source of ``module`` (a pass made it compute something else)."""
        if ONNX_SOURCE in module.operation.attributes:
            del module.operation.attributes[ONNX_SOURCE]

    @staticmethod
    @contextmanager
    def detached(module: ir.Module | ir.Operation) -> Iterator[None]:
        """``module`` without its source for the block (what a structural hash reads: the same model at
        another path is the same model)."""
        attrs = module.operation.attributes
        saved = attrs[ONNX_SOURCE] if ONNX_SOURCE in attrs else None
        if saved is not None:
            del attrs[ONNX_SOURCE]
        try:
            yield
        finally:
            if saved is not None:
                attrs[ONNX_SOURCE] = saved


def mark_float64(module: ir.Module) -> None:
    """Sets ``FLOAT64`` on ``module`` where float64 crosses a public signature or a kept node's boundary."""
    def f64(types) -> bool:
        return any(isinstance(t, ir.ShapedType) and str(ir.ShapedType(t).element_type) == "f64"
                   or str(t) == "f64" for t in types)

    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        if is_public_func(op):
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            found = f64([*ftype.inputs, *ftype.results])
        elif is_onnx_node(op):
            found = f64([*(v.type for v in op.operands), *(r.type for r in op.results)])
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if found:
        module.operation.attributes[FLOAT64] = ir.UnitAttr.get(module.context)


def computes_float64(module: ir.Module | ir.Operation) -> bool:
    """Whether ``module`` carries ``FLOAT64`` (``mark_float64``)."""
    return FLOAT64 in module.operation.attributes


def str_attr(op: ir.Operation, name: str) -> str | None:
    """A string attribute's value, or None when absent."""
    attrs = op.operation.attributes
    return ir.StringAttr(attrs[name]).value if name in attrs else None


def set_str_attr(op: ir.Operation, name: str, value: str) -> None:
    op.operation.attributes[name] = ir.StringAttr.get(value)


def symbol_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.operation.attributes["sym_name"]).value


def is_public_func(op: ir.Operation) -> bool:
    op = op.operation
    if op.name != "func.func" or len(op.regions[0].blocks) == 0:
        return False
    vis = op.attributes["sym_visibility"] if "sym_visibility" in op.attributes else None
    return vis is None or ir.StringAttr(vis).value == "public"


def region_symbol(region: str) -> str:
    """Name of the import that serves a library region: ``collage_rt.<region>``."""
    return f"{RT_MODULE}.{region}"


def set_json_attr(op: ir.Operation, name: str, value) -> None:
    """Stores a JSON-like value (dicts, lists, strings, ints, bools) as an MLIR attribute."""
    op.operation.attributes[name] = _to_attr(value)


def json_attr(op: ir.Operation, name: str, default=None):
    """The JSON-like value stored by ``set_json_attr``, or ``default`` when absent."""
    attrs = op.operation.attributes
    return _from_attr(attrs[name]) if name in attrs else default


def _to_attr(value) -> ir.Attribute:
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if isinstance(value, (list, tuple)):
        return ir.ArrayAttr.get([_to_attr(v) for v in value])
    if isinstance(value, dict):
        return ir.DictAttr.get({k: _to_attr(v) for k, v in value.items()})
    raise TypeError(f"cannot store {type(value).__name__} as an attribute")


def _from_attr(attr: ir.Attribute):
    if isinstance(attr, ir.BoolAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    if isinstance(attr, ir.StringAttr):
        return attr.value
    if isinstance(attr, ir.ArrayAttr):
        return [_from_attr(a) for a in attr]
    if isinstance(attr, ir.DictAttr):
        return {attr[k].name: _from_attr(attr[k].attr) for k in range(len(attr))}
    raise TypeError(f"unexpected attribute {attr}")
