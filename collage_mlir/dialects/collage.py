"""The `collage` vocabulary: discardable attributes, since IREE's context has no Python-defined dialects.

- ``collage.id``      (i64 on an op): the op's stable number, set by ``collage-number-ops``.
- ``collage.backend`` (string on an op or an outlined func): which backend runs it.
- ``collage.region``  (string on an op or an outlined func): the plan region it belongs to.
- ``collage.artifact`` (string on a lowered import): the region artifact file, relative to the artifact dir.
"""

from __future__ import annotations

from ..ir import ir

ID = "collage.id"
BACKEND = "collage.backend"
REGION = "collage.region"
ARTIFACT = "collage.artifact"

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
