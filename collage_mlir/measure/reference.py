"""Reference values: run the model once with IREE alone and capture the values regions consume and
produce, so every candidate is timed on real inputs (index tensors stay valid) and validated against
what the region computes inside the model.

The model's own example inputs are used where given; other arguments get generated data by dtype
(``generated_input``).
"""

from __future__ import annotations

import gc
import re
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from collage_runtime.types import byte_dtype

from ..backends.iree_codegen import iree_compile
from ..dialects import collage
from ..errors import CollageError
from ..graph import body_ops, public_funcs
from ..ir import ir, new_context, parse_module
from ..plan import Plan
from .extract import ValueRef
from .tasks import plan_builder


#: iree-compile's flag that computes every bf16 value of a module in f32, its arguments and results too: run so,
#: a model holding bf16 gives its exact arithmetic, against which the bf16 rounding of any implementation of it
#: (IREE's own included) is measured (``validate.compare``'s ``exact``).
PROMOTE_BF16 = "--iree-input-promote-bf16-to-f32"

#: Generated integers lie in [0, INT_RANGE): small enough to be valid indices into most dimensions.
INT_RANGE = 4


def generated_input(type_: ir.Type, rng: np.random.Generator) -> np.ndarray:
    """Data for an argument with no example input: standard normal floats, integers in
    [0, INT_RANGE), random booleans."""
    if not isinstance(type_, ir.RankedTensorType):
        raise CollageError(f"cannot generate an input of type {type_}; pass example inputs with --input")
    tt = ir.RankedTensorType(type_)
    et = str(tt.element_type)
    dtype = byte_dtype(et)
    if dtype is None:
        raise CollageError(f"cannot generate {et} data; pass example inputs with --input")
    return generated_array(tuple(tt.shape), dtype, rng)


def generated_array(shape: Sequence[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Data of ``shape`` and ``dtype``: standard normal floats, integers in [0, INT_RANGE), random booleans."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, INT_RANGE, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def model_inputs(module: ir.Module, examples: Mapping[str, Sequence[np.ndarray]], seed: int = 0
                 ) -> dict[str, list[np.ndarray]]:
    """Arguments for every public function: ``examples[func]`` where given (checked against the
    signature), generated data elsewhere."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {}
    for func in public_funcs(module):
        name = collage.symbol_name(func)
        types = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs
        given = list(examples.get(name, ()))
        if given and len(given) != len(types):
            raise CollageError(f"@{name} takes {len(types)} arguments but {len(given)} example inputs were given",
                               where="--input")
        for k, (arr, t) in enumerate(zip(given, types)):
            shape = tuple(ir.RankedTensorType(t).shape) if isinstance(t, ir.RankedTensorType) else ()
            if tuple(arr.shape) != shape:
                raise CollageError(f"example input {k} of @{name} has shape {list(arr.shape)}, the function "
                                   f"takes {t}", where="--input")
        out[name] = given or [generated_input(t, rng) for t in types]
    return out


def return_also(func: ir.Operation, values: Sequence[ir.Value]) -> None:
    """Makes ``func`` also return ``values`` (after its own results), each with no result attributes
    (the function's own keep theirs: JAX's ``jax.result_info``); call inside the module's context."""
    block = func.regions[0].blocks[0]
    own = list(block.operations[len(block.operations) - 1].operands)
    attrs = list(ir.ArrayAttr(func.attributes["res_attrs"])) if "res_attrs" in func.attributes else None
    set_returns(func, own + list(values), None if attrs is None else attrs + [ir.DictAttr.get({})] * len(values))


def set_returns(func: ir.Operation, values: Sequence[ir.Value], res_attrs: list | None = None) -> None:
    """Makes ``func`` return exactly ``values`` (its type follows; result attributes ``res_attrs``, else
    none); call inside the module's context. What no longer feeds a result is IREE's to drop."""
    block = func.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1]
    with ir.InsertionPoint(ret):
        ir.Operation.create("func.return", operands=list(values))
    ret.erase()
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ftype.inputs, [v.type for v in values]))
    if res_attrs is not None:
        func.attributes["res_attrs"] = ir.ArrayAttr.get(res_attrs)
    elif "res_attrs" in func.attributes:
        del func.attributes["res_attrs"]


def holds_bf16(module: ir.Module) -> bool:
    """Whether ``module`` computes on bf16 values (IREE runs its exact arithmetic too: ``PROMOTE_BF16``), but
    for kept ONNX nodes or an ONNX tail (their engines run them as the model states)."""
    return not _built(module) and re.search(r"[<x]bf16>", module.operation.get_asm(large_elements_limit=1)) is not None


def capture(module_bytecode: bytes, wanted: Iterable[ValueRef], inputs: Mapping[str, list[np.ndarray]],
            exact: bool = False) -> dict[ValueRef, np.ndarray]:
    """Runs each public function of the (numbered) module with IREE alone on ``inputs`` and returns
    the values ``wanted``: function arguments are the inputs themselves, op results are captured by
    returning them as extra results of a copy of the module. ``exact``: in the module's exact arithmetic
    (bf16 computed in f32: ``PROMOTE_BF16``), every float value as f32."""
    wanted = set(wanted)
    values: dict[ValueRef, np.ndarray] = {}
    if exact:
        inputs = {name: [_promoted(a) for a in args] for name, args in inputs.items()}
    for ref in wanted:
        if ref.op is None:
            values[ref] = inputs[ref.func][ref.index]
    module = parse_module(module_bytecode, new_context())
    collage.OnnxTail.detach(module)  # main's own results, and the captured values after them
    extra: dict[str, list[ValueRef]] = {}
    with module.context, ir.Location.unknown():
        for func in public_funcs(module):
            name = collage.symbol_name(func)
            refs = sorted((r for r in wanted if r.func == name and r.op is not None), key=lambda r: (r.op, r.index))
            if not refs:
                continue
            by_id = {collage.op_id(op.operation): op.operation for op in func.regions[0].blocks[0].operations}
            return_also(func, [by_id[r.op].results[r.index] for r in refs])
            extra[name] = refs
    if not extra:
        return values
    results = invoke_alone(module, {name: inputs[name] for name in extra}, exact=exact)
    for name, refs in extra.items():
        for ref, arr in zip(refs, results[name][len(results[name]) - len(refs):]):
            values[ref] = arr
    return values


class ReferenceBuildError(CollageError):
    """The reference program of a module does not compile: IREE rejects an op as the importer lowered it
    (torch-mlir's ``AveragePool`` with ``ceil_mode`` whose last window starts on the padding)."""


def _promoted(a: np.ndarray) -> np.ndarray:
    """A bf16 array as f32 (what a module compiled with ``PROMOTE_BF16`` takes), else itself."""
    return a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a


def invoke_alone(module: ir.Module, calls: Mapping[str, Sequence[np.ndarray]], exact: bool = False
                 ) -> dict[str, list[np.ndarray]]:
    """Compiles ``module`` with IREE alone and calls each function of ``calls`` on its arguments: every
    result, as arrays that own their data. ``exact``: the module's exact arithmetic (``PROMOTE_BF16``: bf16
    arguments are given as f32, and bf16 results come as f32), for a module ``holds_bf16``. The compile's
    diagnostics go to the log only: the module is collage's (the capture's returns every value, and IREE
    warns of each f64 result it demotes). A module with ONNX nodes kept as ONNX, which IREE cannot run, is
    built by the compile driver under the empty plan instead: IREE alone but for those nodes, each on the engine it is pinned to; so is one with an ONNX
    tail (``collage.OnnxTail``), whose results are then those of the model, the tail's included."""
    import iree.runtime as rt

    if _built(module):
        if exact:
            raise CollageError("no exact arithmetic of a module with kept ONNX nodes or an ONNX tail")
        return _invoke_built(module, calls)
    if exact:
        try:
            vmfb = iree_compile(module, [PROMOTE_BF16], quiet=True)
        except CollageError as exc:
            raise ReferenceBuildError(f"the exact reference run (IREE alone, bf16 in f32) failed to compile: "
                                      f"{exc}") from None
        calls = {name: [_promoted(a) for a in args] for name, args in calls.items()}
    else:
        vmfb = build_reference(module)
    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    vm_module = rt.VmModule.copy_buffer(ctx.instance, vmfb)
    ctx.add_vm_module(vm_module)
    functions = getattr(ctx.modules, vm_module.name)
    out: dict[str, list[np.ndarray]] = {}
    for name, args in calls.items():
        result = functions[name](*[np.require(a, requirements="C") for a in args])
        result = list(result) if isinstance(result, (tuple, list)) else [result]
        # Copies: ``to_host`` may map the device buffer, which must not outlive the context.
        out[name] = [np.array(r.to_host() if hasattr(r, "to_host") else r, copy=True) for r in result]
        del result
    del functions, ctx, vm_module, config
    gc.collect()
    return out


def _built(module: ir.Module) -> bool:
    """Whether the reference of ``module`` is the compile driver's program (kept ONNX nodes, an ONNX tail),
    not IREE alone."""
    return collage.OnnxTail.of(module) is not None or any(
        collage.is_onnx_node(op) for func in public_funcs(module) for op in body_ops(func))


def build_reference(module: ir.Module, out: Path | None = None) -> bytes | None:
    """Builds the reference program of ``module`` as ``invoke_alone`` runs it: IREE alone (the vmfb,
    returned), or, for a module with kept ONNX nodes or an ONNX tail, the compile driver's artifact under
    the empty plan, written to ``out``. ReferenceBuildError where it does not compile."""
    if not _built(module):
        try:
            return iree_compile(module, quiet=True)
        except CollageError as exc:
            raise ReferenceBuildError(f"the reference run (IREE alone) failed to compile: {exc}") from None
    copy = parse_module(module.operation.get_asm(binary=True), new_context())
    try:
        plan_builder()(copy, Plan(), out, source="reference")
    except CollageError as exc:
        raise ReferenceBuildError(f"the reference run (IREE alone, kept ONNX nodes on their engine) failed "
                                  f"to compile: {exc}") from None
    return None


def _invoke_built(module: ir.Module, calls: Mapping[str, Sequence[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    # Imported when used, as collage_runtime: at module load they changed the interpreter's teardown order
    # (nanobind reported IREE's device as leaked at exit: test_exit_is_quiet_with_programs_and_results_alive).
    import collage_runtime
    from collage_runtime.rt_module import RegionFailure

    with tempfile.TemporaryDirectory(prefix="collage-reference-") as tmp:
        build_reference(module, Path(tmp) / "a")
        with collage_runtime.load(Path(tmp) / "a") as program:
            try:
                return {name: [np.array(r, copy=True) for r in program.invoke(name, *args)]
                        for name, args in calls.items()}
            except RegionFailure as exc:  # a kept node's engine raised: a run-time error, as IREE's are
                raise RuntimeError(str(exc)) from None
