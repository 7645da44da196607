"""StableHLO modules with dynamic dims (``?``): which argument axes of ``@main`` carry which dim, and the
module made static for one value of each (a shape bucket), so that every backend and the whole static
pipeline apply unchanged.

Names. A module from ``jax.export`` with symbolic shapes names its axes by the symbols it was exported with
(``b`` of ``jax.export.symbolic_shape("b, 16")``): its ``@main`` measures each dimension variable with
``stablehlo.get_dimension_size``, hands it to the exported body as an argument marked
``jax.global_constant = "b"``, and asserts (``@shape_assertion``) that the other axes of that size equal
it. Every other ``?`` axis is named ``ARG.AXIS``, as a torch or JAX function's are.

Refinement. ``@main``'s arguments take the bucket's static types, each converted back to the dynamic type its
uses expect (as jax does where it calls an exported module), then StableHLO's shape refinement propagates
the shapes, checks and removes jax.export's shape assertions and fails where a shape stays dynamic.
IREE's Python bindings do not register ``stablehlo-refine-shapes``; jaxlib's build of it is public
(``jax.extend.mlir.refine_polymorphic_shapes``), so this step needs jax. The module goes to jaxlib as text
and comes back as bytecode, which IREE's MLIR reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from collage_runtime.shapes import Axes, dims_label

from ..dialects.stablehlo import matching_ops
from ..errors import CollageError
from ..ir import ir, load_module
from . import stablehlo
from .dims import dynamic_dims, inputs_values


def _main(module: ir.Module) -> ir.Operation | None:
    for op in module.body.operations:
        attrs = op.operation.attributes
        if op.operation.name == "func.func" and ir.StringAttr(attrs["sym_name"]).value == "main":
            return op.operation
    return None


def _argument_types(main: ir.Operation) -> list[ir.Type]:
    return list(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs)


def module_axes(module: ir.Module) -> Axes:
    """Per argument of ``@main``, per axis: None where static, else the dim's name (a jax.export symbol, else
    ``ARG.AXIS``); none without a ``@main``."""
    main = _main(module)
    if main is None:
        return ()
    shapes = []
    for t in _argument_types(main):
        if isinstance(t, ir.UnrankedTensorType):
            raise CollageError("an argument of @main has unranked type: collage takes ranked tensors",
                               where="@main")
        shapes.append([t.is_dynamic_dim(a) for a in range(t.rank)] if isinstance(t, ir.RankedTensorType) else [])
    names = _jax_export_names(module, main)
    return tuple(tuple((names.get((k, a), f"{k}.{a}") if dynamic else None) for a, dynamic in enumerate(axes))
                 for k, axes in enumerate(shapes))


def _jax_export_names(module: ir.Module, main: ir.Operation) -> dict[tuple[int, int], str]:
    """(argument, axis) → jax.export symbol, from ``@main``'s ``get_dimension_size`` ops, the symbols they
    give the exported body (``jax.global_constant``) and the assertions that sizes are equal."""
    block = main.regions[0].blocks[0]
    arguments = list(block.arguments)
    measured: dict[ir.Value, tuple[int, int]] = {}  # a get_dimension_size result → (argument, axis)
    equal: list[tuple[ir.Value, ir.Value]] = []
    given: dict[ir.Value, str] = {}  # a value handed to the exported body → its symbol
    callees = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
               for op in module.body.operations if op.operation.name == "func.func"}
    for op in block.operations:
        op = op.operation
        if op.name == "stablehlo.get_dimension_size" and op.operands[0] in arguments:
            measured[op.result] = (arguments.index(op.operands[0]), ir.IntegerAttr(op.attributes["dimension"]).value)
        elif op.name == "stablehlo.compare" and str(op.attributes["comparison_direction"]).endswith("EQ>"):
            equal.append((op.operands[0], op.operands[1]))
        elif op.name == "func.call":
            callee = callees.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            if callee is None or "arg_attrs" not in callee.attributes:
                continue
            for value, attrs in zip(op.operands, ir.ArrayAttr(callee.attributes["arg_attrs"])):
                attrs = ir.DictAttr(attrs)
                if "jax.global_constant" in attrs:
                    given[value] = ir.StringAttr(attrs["jax.global_constant"]).value
    names = {measured[v]: s for v, s in given.items() if v in measured}
    changed = True
    while changed:  # sizes asserted equal to a named one take its name
        changed = False
        for a, b in equal:
            if a in measured and b in measured:
                for x, y in ((measured[a], measured[b]), (measured[b], measured[a])):
                    if x in names and y not in names:
                        names[y], changed = names[x], True
    return names


def load(path: str | Path, context: ir.Context, values: Mapping[str, int] | None = None,
         inputs: Sequence = ()) -> ir.Module:
    """A ``.mlir``/``.mlirbc`` file, normalized: as it is where ``@main`` takes static shapes, else specialised
    to ``values`` (each dim of ``module_axes``), or to the shapes of example ``inputs``; with neither, one
    CollageError naming each dynamic dim and the flag that declares it."""
    module = load_module(path, context)
    axes = module_axes(module)
    if not dynamic_dims(axes):
        # Static arguments, dynamic shapes inside: a JAX function that calls a jax.export module, as lowered.
        if matching_ops(module, _dynamic_result):
            return _refined(module, str(path))
        return stablehlo.normalize(module, where=str(path))
    if values is None:
        values = inputs_values(axes, [f"@main argument {k}" for k in range(len(axes))], inputs, str(path))
    return specialise(module, values, where=str(path))


def specialise(module: ir.Module, values: Mapping[str, int], *, where: str) -> ir.Module:
    """``module`` (its ``@main`` is changed in place) with each dynamic dim fixed to ``values`` (every dim of
    ``module_axes``), refined to static shapes and normalized (``frontends.stablehlo``), in its context."""
    where = f"{where} at {dims_label(values)}"
    axes = module_axes(module)
    main = _main(module)
    if main is None:
        raise CollageError("the module has no @main function: dynamic dims are @main's argument axes", where=where)
    with module.context, ir.Location.unknown():
        block = main.regions[0].blocks[0]
        types = []
        for argument, t, names in zip(block.arguments, _argument_types(main), axes):
            if not any(names):
                types.append(t)
                continue
            static = ir.RankedTensorType.get([values[n] if n is not None else t.get_dim_size(a)
                                              for a, n in enumerate(names)], t.element_type, t.encoding)
            with ir.InsertionPoint.at_block_begin(block):
                back = ir.Operation.create("stablehlo.convert", results=[t], operands=[argument])
            argument.replace_all_uses_with(back.result)
            back.operands[0] = argument
            argument.set_type(static)
            types.append(static)
        results = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results
        main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(types, results))
    return _refined(module, where)


def _refined(module: ir.Module, where: str) -> ir.Module:
    """``module``, whose ``@main`` takes static shapes, refined (``refined``) and normalized, in its context."""
    static = stablehlo.parse(refined(str(module).encode(), where), module.context, where=where)
    _drop_unused_constants(static)
    return static


def _dynamic_result(op: ir.Operation) -> bool:
    return any(isinstance(r.type, ir.RankedTensorType) and not r.type.has_static_shape for r in op.results)


def _drop_unused_constants(module: ir.Module) -> None:
    """Erases ``@main``'s constants nothing uses: what refinement leaves of jax.export's shape assertions
    (their condition, a dimension's value)."""
    main = _main(module)
    for op in list(main.regions[0].blocks[0].operations) if main is not None else ():
        if op.operation.name == "stablehlo.constant" and not list(op.operation.result.uses):
            op.operation.erase()


#: A tensor type with a dynamic dim, in MLIR text.
DYNAMIC_TYPE = re.compile(r"tensor<(?:\d+x)*\?")


def refined(text: bytes, where: str) -> bytes:
    """MLIR ``text`` whose ``@main`` takes static shapes, refined: the shapes inside it made static (bytecode).
    A JAX function that calls a jax.export module lowers so (jax refines it only when it compiles)."""
    try:
        from jax.extend.mlir import refine_polymorphic_shapes
    except ImportError as exc:
        raise CollageError(f"a StableHLO module's dynamic dims are refined by jax's StableHLO ({exc}); run `pip "
                           "install 'collage-mlir[xla]'`", where=where) from None
    try:
        return refine_polymorphic_shapes(text, enable_shape_assertions=True, validate_static_shapes=True)
    except Exception as exc:  # noqa: BLE001  jaxlib raises its runtime error with MLIR's diagnostics
        text = " ".join(str(exc).split())
        detail = text.split("error: ", 1)[-1]  # MLIR's diagnostic, without jaxlib's status prefixes
        raise CollageError(f"the module does not refine to static shapes: {detail[:300]}", where=where) from None


def prepared(module: ir.Module, *, where: str, extra: str = "") -> ir.Module:
    """A copy of the dynamic ``module`` as its dynamic forms take it (``for_iree``, and the ONNX
    translation of ``collage_mlir.shaped``): jax.export's ``@shape_assertion`` calls and torch-mlir's
    ``shape.cstr_*`` constraints dropped (the runtime checks each dim against its declared range and that
    axes sharing a dim agree), calls inlined, canonicalized (IREE's StableHLO canonicalizer folds the shape
    arithmetic); ``extra``: passes (pipeline text, each ending in a comma) run after canonicalizing."""
    from iree.compiler import passmanager

    copy = stablehlo.parse(module.operation.get_asm(binary=True), module.context, where=where)
    with copy.context, ir.Location.unknown():
        for op in matching_ops(copy, lambda o: o.name == "stablehlo.custom_call" and ir.StringAttr(
                o.attributes["call_target_name"]).value == "shape_assertion"):
            op.erase()
        try:
            passmanager.PassManager.parse(
                "builtin.module(func.func(remove-shape-constraints,canonicalize),inline,"
                f"func.func(iree-stablehlo-canonicalize),{extra}cse,symbol-dce)").run(copy.operation)
        except Exception as exc:  # noqa: BLE001  MLIR's pass failure, with its diagnostics
            raise CollageError(f"the dynamic module does not canonicalize: {' '.join(str(exc).split())[:300]}",
                               where=where) from None
    return copy


#: A module attribute: the module's ``?`` dims are symbolic dims that a broadcast never expands (an import
#: of a ``torch.export`` program; a jax.export module says so by ``jax.uses_shape_polymorphism``).
SYMBOLIC_DIMS = "collage.symbolic_dims"


def for_iree(module: ir.Module, *, where: str) -> ir.Module:
    """A copy of the dynamic ``module`` in the form iree-compile takes with its ``?`` dims kept: IREE's
    CPU program of it serves the shapes between buckets (``Fallback.IREE``). IREE 3.13 refuses two ops
    as jax.export writes them:

    - ``stablehlo.dynamic_reshape`` (no legalization): it becomes ``tensor.reshape``, which IREE lowers;
    - ``stablehlo.dynamic_broadcast_in_dim`` whose operand has a ``?`` dim: IREE lowers it only where each
      operand dim is known to expand (size 1 broadcast) or not. A static size-1 dim that meets a larger or
      ``?`` result dim expands (right for any size), other static dims do not. A ``?`` operand dim does not
      expand in a jax.export module (``jax.uses_shape_polymorphism``): jax broadcasts a symbolic dim only to
      itself (its shape polymorphism refuses to trace any other broadcast). In any other module a ``?``
      operand dim stays unknown and IREE refuses the op, which is then one CollageError. A ``torch.export``
      program's import (``SYMBOLIC_DIMS``) is taken as jax.export's: torch.export decides any other
      broadcast of a symbolic dim by a guard when it traces.

    The module is ``prepared``, then put through IREE's own StableHLO preprocessing: it merges chained
    broadcasts into new ops and flattens batched ``dot_general``s with new dynamic reshapes (the rewrites
    and marks go on what it leaves; run again inside iree-compile, it finds nothing more to do)."""
    copy = prepared(module, where=where, extra="iree-stablehlo-to-stablehlo-preprocessing,"
                                                "func.func(iree-stablehlo-canonicalize),")
    attrs = copy.operation.attributes
    symbolic = SYMBOLIC_DIMS in attrs or ("jax.uses_shape_polymorphism" in attrs
                                          and ir.BoolAttr(attrs["jax.uses_shape_polymorphism"]).value)
    with copy.context, ir.Location.unknown():
        for op in matching_ops(copy, lambda o: o.name == "stablehlo.dynamic_reshape"):
            with ir.InsertionPoint(op):
                reshape = ir.Operation.create("tensor.reshape", results=[op.result.type], operands=list(op.operands))
            op.result.replace_all_uses_with(reshape.result)
            op.erase()
        for op in matching_ops(copy, lambda o: o.name == "stablehlo.dynamic_broadcast_in_dim"):
            operand, result = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.result.type)
            into = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            expanding, kept = [], []
            for d in range(operand.rank):
                if operand.is_dynamic_dim(d):
                    if symbolic:
                        kept.append(d)
                elif operand.get_dim_size(d) == 1 and (result.is_dynamic_dim(into[d])
                                                       or result.get_dim_size(into[d]) != 1):
                    expanding.append(d)
                else:
                    kept.append(d)
            op.attributes["known_expanding_dimensions"] = ir.DenseI64ArrayAttr.get(expanding)
            op.attributes["known_nonexpanding_dimensions"] = ir.DenseI64ArrayAttr.get(kept)
    return copy
