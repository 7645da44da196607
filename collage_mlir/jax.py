"""JAX entry points: ``collage_mlir.jax.compile(fn, *example_args)`` and ``collage_mlir.jax.jit(fn)``.

    compiled = collage_mlir.jax.compile(f, x, w, plan="prefer:xla-cpu")
    y = compiled(x, w)                      # numpy arrays in, numpy arrays out (the function's pytree)
    g = collage_mlir.jax.jit(f)             # compiles on first call per input signature
    h = collage_mlir.jax.jit(exported, dims={"b": (1, 8, 32)}, pad=["b"])   # a jax.export with symbolic shapes

The function is lowered by ``jax.jit(fn).lower(*args)`` to StableHLO, placed by a plan (as in
``collage_mlir.torch``: the one named, else the one tuned before for this structure from the cost DB,
else a tune within ``tune_budget``, else the default) and compiled into an artifact under the cache
directory.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from collage_runtime.shapes import Axes, DimRange, bucket_for, cut_to, dims_label, pad_to

from .entry import BuildOptions, Int8, PlanChoice, choose_plan, compile_cached, compile_int8, compile_int8_range
from .errors import CollageError
from .frontends.onnx_calibrate import Agreement
from .frontends.dims import (PYTHON, DimPlan, check_declared, input_values, named_onnx_dims,
                              positional_dims, resized, resized_batch)
from .frontends import stablehlo
from .frontends.jax import import_jax
from .ir import new_context
from .measure.import_check import check_import as check, jax_source
from .shaped import batch_like, check_padding_exact, fastest_dynamic, output_axes, plan_slack


class CompiledFunction:
    """A JAX function compiled by collage for one input signature."""

    def __init__(self, program, out_tree, choice: PlanChoice, agreement: Agreement | None = None):
        self.program = program
        self.plan = choice.plan
        self.plan_how = choice.how  # entry.PlanHow: "given", "tuned before", "faster in f32", ...
        #: int8 (``precision="int8"``): the program against the f32 model on the held-out samples.
        self.agreement = agreement
        self._out_tree = out_tree

    def __call__(self, *args):
        import jax

        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        return jax.tree_util.tree_unflatten(self._out_tree, list(self.program.invoke("main", *leaves)))


def compile(fn: Callable, *example_args, plan: str | None = None, tune_budget: float | None = None,  # noqa: A001
            backends: Sequence[str] | None = None, precision: str | None = None, db: str | Path | None = None,
            threads: int | None = None, check_import: bool = True, calibrate: Sequence | None = None,
            calibration_method: str = "minmax", max_drop: float | None = None) -> CompiledFunction:
    """Lowers ``fn`` for ``example_args``' shapes and dtypes and compiles it by ``plan`` (None: tuned
    before, else tuned within ``tune_budget`` seconds when given, over ``backends`` (default: every
    available one) and those computing in ``precision`` (default: the model's own, bf16 for a bf16 model;
    ``"bf16"``: the bf16 backends for an f32 one too), else the default). ``check_import``:
    the lowered module runs with IREE alone on the example arguments and must match ``jax.jit(fn)``
    (``measure.import_check``; the verdict is cached).

    ``precision="int8"`` quantizes the f32 function first (``entry.quantize``, as ``collage_mlir.torch.compile``
    does): ``calibrate`` is a sequence of batches, each a tuple of ``fn``'s arguments with the example
    arguments' shapes (the last quarter held out; ``max_drop`` bounds the share of them whose top class
    changes, checked on the compiled program too: ``agreement``). Weights ``fn`` closes over are constants,
    quantized per channel; weights passed as arguments are quantized as activations."""
    int8 = Int8.requested(precision, calibrate, calibration_method, max_drop, _leaves)
    return _compile(fn, example_args, BuildOptions(plan, tune_budget, backends, None if int8 else precision, db=db,
                                                   threads=threads, check_import=check_import), int8)


def _compile(fn: Callable, example_args: tuple, options: BuildOptions, int8: Int8 | None) -> CompiledFunction:
    """``compile``'s work, its keywords as ``options`` (an int8 module is tuned at its own precision: None) and
    ``int8``'s batches, each the flattened arguments."""
    import jax

    import collage_runtime

    fn = _callable(fn)
    name = _source_name(fn)
    module = import_jax(fn, example_args, new_context())
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *example_args))
    canonical = _leaves(example_args)
    if options.check_import:
        check(module, jax_source(fn, example_args), canonical, where=name)
    if int8 is not None:
        out, choice, quantized = compile_int8(module, int8, canonical, options, name)
        program = collage_runtime.load(out, threads=options.threads)
        return CompiledFunction(program, out_tree, choice, quantized.check(program))
    choice = choose_plan(module, options.plan, tune_budget=options.tune_budget, backends=options.backends,
                         db=options.db, examples={"main": canonical}, precision=options.precision)
    program = collage_runtime.load(compile_cached(module, choice, source=name), threads=options.threads)
    return CompiledFunction(program, out_tree, choice)


def jit(fn: Callable, *, plan: str | None = None, tune_budget: float | None = None,
        backends: Sequence[str] | None = None, precision: str | None = None, db: str | Path | None = None,
        check_import: bool = True, dims: Mapping["str | tuple[str, ...]", "int | tuple[int, int, int]"] | None = None,
        pad: Sequence[str] = (), calibrate: Sequence | None = None, calibration_method: str = "minmax",
        max_drop: float | None = None) -> Callable[..., Any]:
    """Like ``jax.jit``: compiles ``fn`` with collage on the first call for each input signature, its plan
    chosen as ``compile`` chooses it (``plan``, ``tune_budget``, ``backends``, ``precision``, ``db``;
    ``precision="int8"`` with ``calibrate``, ``calibration_method`` and ``max_drop`` as ``compile`` takes them,
    the batches cut or repeated to each signature's shapes: ``dims.resized_batch``).

    ``dims`` (``{"ARG.AXIS": (MIN, OPT, MAX)}``, ``ARG`` counting the flattened array arguments, a tuple of
    them for axes of one size: ``{("0.1", "1.1"): (8, 64, 128)}``, token ids' and their mask's sequence, the
    dim named by the first; for a ``jax.export.Exported`` with symbolic shapes, its symbols: ``{"b": (1, 8,
    32)}``) declares ranges: a
    call out of range is a CollageError, every bucket (each dim's MIN, OPT and MAX) is compiled at the
    first call, and with ``pad`` (dims rows are independent along, such as a batch) a shape between
    buckets runs on the next bucket up, zero-padded, its results cut back: no compile per shape in range.
    Without ``pad`` a shape between buckets runs on the fastest engine that takes the module with symbolic
    dims kept (``shaped.fastest_dynamic``: IREE, or the module's ONNX translation on ONNX Runtime or
    OpenVINO; built with the buckets and checked against the OPT bucket): an ``Exported``'s own module, or
    ``fn`` exported with a symbol per declared dim. Where jax cannot export
    ``fn`` so (its Python depends on a dim's value), a warning says why and such a shape is compiled on
    first use, as ``jax.jit`` does. In int8 a declared range is one artifact (``entry.compile_int8_range``):
    the module with its symbolic dims translated to ONNX and quantized once, its buckets and what serves
    between them on the int8 engines; where it cannot be built, a warning says why and each shape is
    compiled on first use."""
    import jax

    int8 = Int8.requested(precision, calibrate, calibration_method, max_drop, _leaves)
    options = BuildOptions(plan, tune_budget, backends, None if int8 else precision, db=db, check_import=check_import)
    exported = fn if isinstance(fn, jax.export.Exported) else None
    fn = _callable(fn)
    compiled: dict[tuple, CompiledFunction] = {}
    declared = positional_dims(dims, pad, exported is not None) if dims else None
    plan_of_dims = declared and declared.plan
    state: dict[str, Any] = {}

    def signature_call(leaves: list, tree):
        key = _key(leaves, tree)
        if key not in compiled:
            shapes = [np.shape(a) for a in leaves]
            at_shape = int8 and replace(int8, samples=tuple(resized_batch(b, shapes) for b in int8.samples))
            compiled[key] = _compile(fn, jax.tree_util.tree_unflatten(tree, leaves), options, at_shape)
        return compiled[key](*jax.tree_util.tree_unflatten(tree, leaves))

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if plan_of_dims is None:
            return signature_call(leaves, tree)
        leaves = [np.asarray(a) for a in leaves]
        if "axes" not in state:
            state["axes"] = symbol_axes(exported, plan_of_dims.dims) if exported is not None \
                else declared.axes(leaves)
            state["fixed"] = _fixed(exported, leaves, state["axes"])
        _check_fixed(state["fixed"], leaves)
        axes = state["axes"]
        values = input_values(axes, leaves, "jit")
        plan_of_dims.check(values)
        if int8 is not None and "range" not in state:
            source = exported if exported is not None else _exported(fn, leaves, tree, axes, plan_of_dims.dims)
            state["range"] = source and _int8_range(source, fn, args, plan_of_dims, axes, options, int8)
            state["out_tree"] = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
        if state.get("range") is not None:
            program = state["range"]
            return jax.tree_util.tree_unflatten(state["out_tree"], list(program.invoke(program.table.function, *leaves)))
        if int8 is not None:  # the range did not build: each shape compiled on first use
            return signature_call(leaves, tree)
        if "outputs" not in state:  # every bucket compiled at once; which result axes carry the dims
            shapes, opt = [], {d.name: d.opt for d in plan_of_dims.dims}
            for bucket in plan_of_dims.grid():
                grown = [_resize(a, names, bucket) for a, names in zip(leaves, axes)]
                results, state["out_tree"] = jax.tree_util.tree_flatten(signature_call(grown, tree))
                shapes.append([np.shape(o) for o in results])
                if dict(bucket) == opt or "check" not in state:
                    regions = compiled[_key(grown, tree)].program.manifest.regions
                    state["check"] = (grown, [np.array(r) for r in results], dims_label(bucket),
                                      plan_slack([r.tolerance.rtol for r in regions]))
            state["outputs"] = output_axes(plan_of_dims, plan_of_dims.grid(), shapes)
            def flat(xs):
                return jax.tree_util.tree_leaves(signature_call(xs, tree))

            for dim in (d for d in plan_of_dims.dims if d.name in plan_of_dims.pad):
                top = max(plan_of_dims.grid(), key=lambda b: b[dim.name])
                small = {**top, dim.name: dim.min}  # MIN is a value of every grid: compiled
                check_padding_exact(flat, None if batch_like(axes, dim.name) else flat,
                                    [_resize(a, names, top) for a, names in zip(leaves, axes)], axes,
                                    state["outputs"], top, small, dim.name, "jit")
            if plan_of_dims.unserved(fallback=False) is not None:
                source = exported if exported is not None else _exported(fn, leaves, tree, axes, plan_of_dims.dims)
                if source is not None:
                    try:
                        state["dynamic"] = _dynamic_runner(source, *state.pop("check"))
                    except CollageError as exc:  # no engine takes its dims (a dynamic_gather): as jax.jit does
                        warnings.warn(f"collage_mlir.jax.jit: {exc}; a shape between buckets compiles on first use",
                                      RuntimeWarning, stacklevel=2)
        target = bucket_for(plan_of_dims.grid(), values, plan_of_dims.pad)
        if target is None and "dynamic" in state:
            return jax.tree_util.tree_unflatten(state["out_tree"], list(state["dynamic"](leaves)))
        if target is None or dict(target) == values:
            return signature_call(leaves, tree)
        result = signature_call([pad_to(a, names, target) for a, names in zip(leaves, axes)], tree)
        results, out_tree = jax.tree_util.tree_flatten(result)
        return jax.tree_util.tree_unflatten(out_tree, [cut_to(np.asarray(r), names, values)
                                                       for r, names in zip(results, state["outputs"])])

    return call


def _int8_range(exported, fn: Callable, args: tuple, dim_plan: DimPlan, axes: Axes, options: BuildOptions,
                int8: Int8):
    """The declared range in int8 as one loaded artifact (``entry.compile_int8_range``): ``exported``'s module
    (symbolic dims) translated to ONNX with its dims kept (``shaped.dynamic_onnx``), named as ``axes`` names
    them, checked on the held-out batches (above ``max_drop``: the CollageError stands). None, with a warning
    saying why, where the module does not translate or its buckets do not build."""
    import collage_runtime

    from .shaped import dynamic_onnx  # when used: see entry.compile_int8

    name = _source_name(fn)
    leaves = _leaves(args)
    try:
        model = dynamic_onnx(stablehlo.parse(exported.mlir_module(), new_context(), where=name), name)
        data = named_onnx_dims(model, axes)
        # Each bucket's import is checked on the first call's arrays with their entries repeated or cut to its
        # shape (zero rows would be an all-masked sequence: 0/0 in a masked mean, no number to compare)
        out, quantized = compile_int8_range(data, dim_plan, lambda values: resized(leaves, axes, values), options,
                                            int8, source=name)
    except CollageError as exc:
        warnings.warn(f"collage_mlir.jax.jit: the int8 range is not one artifact ({exc}); each shape compiles on "
                      "first use", RuntimeWarning, stacklevel=3)
        return None
    program = collage_runtime.load(out, threads=options.threads)
    quantized.check(program)
    return program


def _exported(fn: Callable, leaves: list, tree, axes: Axes, dims: Sequence[DimRange]):
    """``fn`` exported by ``jax.export`` for ``leaves``' dtypes and shapes with a symbol for each declared dim
    (``d0``, ``d1``, ... in the order the axes name them), constrained to its declared range (``x[:n]`` of a
    table of 128 rows exports for ``n <= 128``), or None with a warning where jax refuses."""
    import jax

    names = list(dict.fromkeys(n for names in axes for n in names if n is not None))
    ranges = {d.name: d for d in dims}
    constraints = [c for k, n in enumerate(names) if n in ranges
                   for c in (f"d{k} >= {ranges[n].min}", f"d{k} <= {ranges[n].max}")]
    symbols = dict(zip(names, jax.export.symbolic_shape(", ".join(f"d{k}" for k in range(len(names))),
                                                        constraints=constraints)))
    specs = [jax.ShapeDtypeStruct(tuple(symbols[n] if n is not None else size for n, size in zip(names_, np.shape(a))),
                                  np.asarray(a).dtype) for a, names_ in zip(leaves, axes)]
    try:
        return jax.export.export(jax.jit(fn))(*jax.tree_util.tree_unflatten(tree, specs))
    except Exception as exc:  # noqa: BLE001  jax's shape-polymorphism errors have several types
        warnings.warn(f"collage_mlir.jax.jit: the function does not export with symbolic dims "
                      f"({' '.join(str(exc).split())[:200]}); a shape between buckets compiles on first use",
                      stacklevel=3)
        return None


def _fixed(exported, leaves: list, axes: Axes) -> list[tuple[np.dtype, tuple]]:
    """Each flattened argument's dtype and shape, None on a declared dim's axis: an ``Exported``'s own
    signature, else the first call's arrays (a declared range compiles once, so every other axis is fixed)."""
    given = exported.in_avals if exported is not None else leaves  # each has a dtype and a shape
    return [(np.dtype(a.dtype), tuple(None if n is not None else d for d, n in zip(a.shape, names)))
            for a, names in zip(given, axes)]


def _check_fixed(fixed: list[tuple[np.dtype, tuple]], leaves: list) -> None:
    """One CollageError line unless ``leaves`` match ``fixed`` (``_fixed``) in count, dtype, rank and every
    axis no declared dim names: no engine sees an array of another shape than the one it was built for."""
    if len(leaves) != len(fixed):
        raise CollageError(f"the function takes {len(fixed)} array argument(s), got {len(leaves)}", where="jit")
    for k, ((dtype, shape), a) in enumerate(zip(fixed, leaves)):
        if a.dtype != dtype or a.ndim != len(shape) or any(d is not None and d != n for d, n in zip(shape, a.shape)):
            want = "x".join("?" if d is None else str(d) for d in shape)
            raise CollageError(f"argument {k}: expected {dtype}[{want}] (? a declared dim), got {a.dtype}"
                               f"[{'x'.join(map(str, a.shape))}]", where="jit")


def _key(leaves: list, tree) -> tuple:
    """What a compiled signature is kept under: the argument tree and each array's shape and dtype."""
    return tree, tuple((np.shape(a), np.asarray(a).dtype.str) for a in leaves)


def _dynamic_runner(exported, arrays: list, want: list, bucket: str, slack: float) -> Callable:
    """The fastest engine that runs ``exported``'s module with its symbolic dims kept
    (``shaped.fastest_dynamic``: IREE's program of it, or its ONNX translation on ONNX Runtime or OpenVINO):
    flat arrays in, flat arrays out; each checked to give ``want`` (bucket ``bucket``'s results) on
    ``arrays``, within ``slack`` of each output's scale beyond f32's (the bucket plan's: ``plan_slack``)."""
    import tempfile
    import weakref

    where = "jax.export"
    directory = tempfile.TemporaryDirectory(prefix="collage-dynamic-")
    try:
        run = fastest_dynamic(stablehlo.parse(exported.mlir_module(), new_context(), where=where), where, arrays, want,
                              bucket, Path(directory.name), slack=slack)
    except BaseException:
        directory.cleanup()
        raise
    weakref.finalize(run, directory.cleanup)  # the engine's file lives as long as its runner
    return run


def _source_name(fn: Callable) -> str:
    """What an artifact and an error name the function by: ``jax:NAME``."""
    return f"jax:{getattr(fn, '__name__', 'fn')}"


def _leaves(args) -> list[np.ndarray]:
    """``args``' flattened arrays in the dtypes jax canonicalizes them to (``device_put``; no x64: int64 becomes
    int32), as they are lowered."""
    import jax

    return [np.asarray(a) for a in jax.tree_util.tree_leaves(jax.device_put(args))]


def _callable(fn):
    """``fn``, or for a ``jax.export.Exported`` its ``call`` (lowered, then refined to static shapes)."""
    import jax

    return fn.call if isinstance(fn, jax.export.Exported) else fn


def symbol_axes(exported, dims: Sequence) -> Axes:
    """The axes of a ``jax.export.Exported``'s flattened arguments that its symbols name (``b`` of
    ``symbolic_shape("b, 16")``); every symbol declared in ``dims``, one CollageError line otherwise."""
    axes = tuple(tuple(None if isinstance(d, int) else str(d) for d in aval.shape) for aval in exported.in_avals)
    for k, names in enumerate(axes):
        for a, name in enumerate(names):
            if name is not None and not name.isidentifier():
                raise CollageError(f"argument {k} axis {a} of the exported function is '{name}': declare dims "
                                   "for its symbols' axes of their own (an expression is not taken)", where="dims")
    check_declared(axes, dims, PYTHON)
    return axes


def _resize(array: np.ndarray, axes: tuple, values: Mapping[str, int]) -> np.ndarray:
    """``array`` at a bucket's shape: zero-padded or cut along each axis that carries a dim."""
    grown = pad_to(array, axes, {n: max(values[n], array.shape[k]) for k, n in enumerate(axes) if n is not None})
    return cut_to(grown, axes, values)
